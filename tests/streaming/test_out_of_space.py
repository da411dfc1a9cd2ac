"""The one line a job stops with on a full disk (``streaming.lifecycle.stopping.out_of_space``)."""

from __future__ import annotations

import errno

from streaming.lifecycle.stopping import out_of_space


def test_a_full_disk_anywhere_in_the_chain_is_named_with_the_checkpoint() -> None:
    def raised() -> Exception:
        try:
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError as e:
                raise RuntimeError("batch 7 failed") from e
        except RuntimeError as e:
            return e

    for error in (raised(), "java.io.IOException: No space left on device\n\tat ..."):
        line = out_of_space(error, "/var/lib/isrwatch")
        assert line is not None and "\n" not in line
        assert line.startswith("no space left on device") and "/var/lib/isrwatch" in line
    assert out_of_space(OSError(errno.EACCES, "Permission denied"), "/x") is None
    assert out_of_space("query failed", "/x") is None
    assert out_of_space(None, "/x") is None
