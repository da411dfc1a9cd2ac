"""Malformed telemetry: four bad records with the reasons the job must give them
(``BAD_RECORDS``, written beside the collector's by tests/e2e/test_telemetry_gap.py and
test_steady_load.py), and seeded generators for the fuzz campaign (tests/e2e/test_fuzz_campaign.py).

``Fuzz(rng, bases, now_ms).records(count, headers)``: ``count`` (kind, (key, value, headers))
records, each kind a generator over ``bases`` (valid telemetry shaped like the collector's,
``telemetry_bases``). The same seed gives the same records; timestamps are relative to
``now_ms``. Every record claims cluster ``fuzz`` (or none): none speaks for a watched cluster.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

from isrwatch.telemetry import IsrChange, Observation, TelemetryRecord, encode_record

__all__ = ["BAD_RECORDS", "Fuzz", "Record", "telemetry_bases", "FUZZ_CLUSTER", "ODD_TOPIC"]

FUZZ_CLUSTER = "fuzz"  # the cluster the fuzzed telemetry claims to be from: never the watched one
ODD_TOPIC = "fuzz-odd"
YEAR_MS = 365 * 86_400_000
Record = tuple[bytes | None, bytes | None, list[tuple[str, str | bytes | None]] | None]  # key, value, headers

# value -> the reason the job must give (docs/streaming.md, "Parsing and validation")
BAD_RECORDS = {
    b"this is not json": "not_json",
    b"[1, 2, 3]": "not_object",
    json.dumps({"version": 99, "cluster": "e2e", "observations": []}).encode(): "unknown_version",
    json.dumps({"version": 1, "source": "test", "sent_ms": 1, "observations": []}).encode(): "missing_cluster",
}


class Fuzz:
    """Seeded generators of malformed telemetry, one per kind, over ``bases`` (valid telemetry)."""

    def __init__(self, rng: random.Random, bases: list[bytes], now_ms: int) -> None:
        self.rng = rng
        self.bases = bases
        self.now = now_ms

    def base(self) -> bytes:
        return self.rng.choice(self.bases)

    def body(self) -> dict[str, Any]:
        return json.loads(self.base())

    def key(self) -> bytes | None:
        return self.rng.choice([None, b"", FUZZ_CLUSTER.encode(), self.rng.randbytes(self.rng.randint(1, 300))])

    def observation(self, **changes: Any) -> Observation:
        """A caught-up follower of ``ODD_TOPIC`` (nothing in it justifies an alert), with ``changes``."""
        p = self.rng.randint(0, 5)
        fields: dict[str, Any] = dict(topic=ODD_TOPIC, partition=p, broker_id=2, leader_id=1, t_ms=self.now,
                                      leo=100, leader_leo=100, hw=100, prev_t_ms=self.now - 500, prev_leo=100,
                                      prev_leader_leo=100, isr=(1, 2), replicas=(1, 2))  # fmt: skip
        return Observation(**{**fields, **changes})

    def record(self, *obs: Observation) -> bytes:
        version = self.rng.choice([2, 3])
        return encode_record(TelemetryRecord(FUZZ_CLUSTER, "fuzz", self.now, obs, version=version))

    # -- the kinds ---------------------------------------------------------

    def random_bytes(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(1, 400))

    def not_utf8(self) -> bytes:
        bad = self.rng.choice([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"])
        b = self.base()
        at = self.rng.randint(0, len(b))
        return b[:at] + bad + b[at:]

    def text(self) -> bytes:
        alphabet = ' {}[]":,0123456789abcdeé€\U0001f600\n\t\\'
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(1, 200))).encode()

    def truncated(self) -> bytes:
        b = self.base()
        return b[: self.rng.randint(1, len(b) - 1)]

    def mutated(self) -> bytes:
        b = bytearray(self.base())
        for _ in range(self.rng.randint(1, 8)):
            at = self.rng.randrange(len(b))
            op = self.rng.randrange(3)
            if op == 0:
                b[at] = self.rng.randrange(256)
            elif op == 1:
                b[at:at] = self.rng.randbytes(self.rng.randint(1, 4))
            elif len(b) > 1:
                del b[at]
        return bytes(b)

    def wrong_types(self) -> bytes:
        body = self.body()
        wrong: list[Any] = [None, "1", 1.5, True, [], {}, [1, "a"], "x" * 50, -1]
        columns = ["topics", "partitions", "followers"] if "followers" in body else ["observations"]
        field = self.rng.choice(["version", "cluster", "sent_ms", "isr_changes", "obs", *columns])
        if field == "obs" and body.get("observations"):
            o = self.rng.choice(body["observations"])
            o[self.rng.choice(sorted(o))] = self.rng.choice(wrong)
        elif field == "obs" and "followers" in body:  # version 3: one entry of one column
            group = body[self.rng.choice(["partitions", "followers"])]
            column = group[self.rng.choice(sorted(group))]
            if column:
                column[self.rng.randrange(len(column))] = self.rng.choice(wrong)
        else:
            body[field] = self.rng.choice(wrong)
        return json.dumps(body).encode()

    def unknown_version(self) -> bytes:
        body = self.body()
        version = self.rng.choice([0, 2, 3, 99, -1, 2**31, 2**63, "2", None, "missing"])
        if version == "missing":
            del body["version"]
        else:
            body["version"] = version
        return json.dumps(body).encode()

    def bad_numbers(self) -> bytes:
        value = self.rng.choice([math.nan, math.inf, -math.inf, 2**64, 2**70, -(2**63) - 1, 1e300, -5, -1])
        body = self.body()
        field = self.rng.choice(["t_ms", "leo", "leader_leo", "partition", "broker_id", "hw", "prev_t_ms"])
        if "followers" in body:  # version 3: the first entry of the field's column
            column = body["partitions" if field in ("partition", "hw") else "followers"][field]
            if column:
                column[0] = value
        else:
            target = body["observations"][0] if body.get("observations") else body
            target[field] = value
        return json.dumps(body).encode()  # NaN and Infinity as JavaScript writes them: not JSON

    def future_t(self) -> bytes:
        years = self.rng.randint(1, 50)
        return self.record(self.observation(t_ms=self.now + years * YEAR_MS, prev_t_ms=self.now))

    def past_t(self) -> bytes:
        t = self.rng.choice([1, 1000, self.now - self.rng.randint(1, 40) * YEAR_MS])
        return self.record(self.observation(t_ms=t, prev_t_ms=None))

    def offsets_backwards(self) -> bytes:
        which = self.rng.randrange(3)
        if which == 0:  # the leader's log went backwards
            return self.record(self.observation(prev_leader_leo=200))
        if which == 1:  # time went backwards
            return self.record(self.observation(prev_t_ms=self.now + 10_000))
        return self.record(self.observation(prev_leo=500))  # the follower's log went backwards

    def empty(self) -> bytes | None:
        return self.rng.choice([None, b"", b" ", b"{}", b"null", b"[]", b'""'])

    def duplicated(self) -> bytes:
        return self.base()  # a real record (cluster renamed) again: read, not dead-lettered

    def oversized(self) -> bytes:
        size = self.rng.randint(200_000, 900_000)  # under the 0.9 broker's message.max.bytes (1,000,012)
        if self.rng.random() < 0.5:
            return self.rng.randbytes(size)
        return self.base()[:-1] + b',"pad":"' + b"a" * size + b'"}'

    def keys_and_headers(self) -> bytes | None:
        return self.rng.choice([self.base(), self.mutated(), self.random_bytes(), None])

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        names = ["", "a", "\u00e9", "x" * 300, "content-type", "version"]
        return [
            (self.rng.choice(names), self.rng.choice([None, b"", self.rng.randbytes(self.rng.randint(1, 500))]))
            for _ in range(self.rng.randint(0, 8))
        ]

    def kinds(self) -> dict[str, tuple[float, Callable[[], bytes | None]]]:
        """kind -> (share of the records, generator)."""
        return {
            "random_bytes": (0.14, self.random_bytes),
            "not_utf8": (0.08, self.not_utf8),
            "text": (0.06, self.text),
            "truncated": (0.12, self.truncated),
            "mutated": (0.16, self.mutated),
            "wrong_types": (0.08, self.wrong_types),
            "unknown_version": (0.06, self.unknown_version),
            "bad_numbers": (0.06, self.bad_numbers),
            "future_t": (0.04, self.future_t),
            "past_t": (0.04, self.past_t),
            "offsets_backwards": (0.04, self.offsets_backwards),
            "empty": (0.04, self.empty),
            "duplicated": (0.02, self.duplicated),
            "keys_and_headers": (0.06, self.keys_and_headers),
        }

    def records(self, count: int, headers_ok: bool) -> list[tuple[str, Record]]:
        """``count`` (kind, record) pairs in a seeded order, five of them oversized."""
        kinds = self.kinds()
        names = list(kinds)
        weights = [kinds[n][0] for n in names]
        out: list[tuple[str, Record]] = []
        for _ in range(count - 5):
            kind = self.rng.choices(names, weights)[0]
            value = kinds[kind][1]()
            headers = self.headers() if kind == "keys_and_headers" and headers_ok else None
            out.append((kind, (self.key(), value, headers)))
        for _ in range(5):
            out.insert(self.rng.randrange(len(out)), ("oversized", (self.key(), self.oversized(), None)))
        return out


def telemetry_bases(rng: random.Random, topic: str, now_ms: int, count: int = 40) -> list[bytes]:
    """Valid telemetry records shaped like the collector's (cluster ``fuzz``): what the
    truncations and mutations start from. Seeded, and relative to ``now_ms``."""
    out = []
    for _ in range(count):
        obs = []
        for p in range(rng.randint(1, 3)):
            for broker in rng.sample([1, 2, 3], 2):
                leo = rng.randint(0, 10**9)
                t = now_ms - rng.randint(0, 5000)
                obs.append(Observation(topic, p, broker, 1 if broker != 1 else 2, t, leo, leo + rng.randint(0, 50),
                                       leo, t - 500, leo - rng.randint(0, 50), leo, (1, 2, 3), (1, 2, 3), 10_000, 1))  # fmt: skip
        changes = (IsrChange(now_ms, topic, 0, (1, 2, 3), (1, 2)),) if rng.random() < 0.2 else ()
        version = rng.choice([2, 3])  # what collectors write: older ones 2, current ones 3
        out.append(
            encode_record(TelemetryRecord(FUZZ_CLUSTER, "collector", now_ms, tuple(obs), changes, version=version))
        )
    return out
