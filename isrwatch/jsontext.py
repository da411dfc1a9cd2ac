"""Reading a record's JSON the way every isrwatch reader does.

One rule for the telemetry (``isrwatch.telemetry.decode_record``) and the state topic
(``isrwatch.status.status_from_record``): any bytes either parse or raise ``ValueError``
whose text starts ``not JSON:``. ``NaN``, ``Infinity`` and ``-Infinity``, which Python's
``json`` reads by default, are not JSON (RFC 8259), and the streaming job's parser in
Spark refuses them too (``not_json``); JSON nested deeper than Python's parser goes is
refused with the same prefix rather than a ``RecursionError``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads", "type_name", "INT64", "PYTHON_TYPES"]

# The integers a field may hold: what Kafka's offsets and times fit in (Spark's BIGINT).
INT64 = (-(2**63), 2**63)
# Each JSON type as the exact Python types ``loads`` gives for it (a bool is not an integer
# here, though Python's bool is an int; a number may be written without a fraction).
PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
# ...and back, for a reason: each Python type's own JSON name (int: integer, float: number).
_NAMES = {kinds[-1]: name for name, kinds in PYTHON_TYPES.items()}


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


# One decoder for every call (json.loads with an argument builds a new one each time: a
# fifth of the exporter's cost per record, measured).
_DECODER = json.JSONDecoder(parse_constant=_refuse)


def loads(data: bytes | bytearray | str) -> Any:
    """``data`` parsed, or ``ValueError("not JSON: <why>")``. Bytes in any of JSON's
    encodings (UTF-8, -16, -32), as ``json.loads`` reads them."""
    try:
        if isinstance(data, (bytes, bytearray)):
            data = data.decode(json.detect_encoding(data), "surrogatepass")
        return _DECODER.decode(data)
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"not JSON: {e}") from None


def type_name(value: object) -> str:
    """The JSON type of a parsed value, for a reason: ``null``, ``integer``, ``array``..."""
    return _NAMES.get(type(value), type(value).__name__)
