"""Run a Python program with its wall clock shifted: ``python skewed_clock.py SECONDS python -m MODULE ARGS...``.

A host whose clock is off (NTP broken) by a constant: ``time.time`` and ``time.time_ns``
(what isrwatch stamps telemetry with, and what logging prints) are shifted by SECONDS;
the monotonic clock, which every timeout uses, is not. Used instead of libfaketime,
which also bends the timeouts of a process's waits (measured: ``concurrent.futures.wait``
returned after 0.02 s of a 0.5 s timeout and the collector's rounds hung on a paused
broker for 25 s), which a host with a skewed clock does not do.
"""

from __future__ import annotations

import runpy
import sys
import time


def main(argv: list[str]) -> None:
    skew_s = float(argv[1])
    rest = argv[2:]
    if len(rest) < 3 or rest[1] != "-m":
        raise SystemExit("usage: skewed_clock.py SECONDS PYTHON -m MODULE [ARGS...]")
    real_time, real_time_ns = time.time, time.time_ns
    skew_ns = int(skew_s * 1e9)
    time.time = lambda: real_time() + skew_s  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + skew_ns  # type: ignore[assignment]
    module = rest[2]
    sys.argv = [module, *rest[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv)
