"""isrwatch.jsontext: the one JSON reading of every isrwatch reader (unit tests of its
logic; the readers that use it are tested on real Kafka in tests/exporter)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isrwatch import jsontext

_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@given(_ANY_JSON)
def test_a_parsed_value_is_named_by_the_json_type_whose_python_types_hold_it(value: object) -> None:
    parsed = jsontext.loads(json.dumps(value).encode())
    name = jsontext.type_name(parsed)
    assert type(parsed) in jsontext.PYTHON_TYPES[name]


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("{}", "object"),
        ("[]", "array"),
        ('""', "string"),
        ("1", "integer"),
        ("1.5", "number"),
        ("1e3", "number"),
        ("true", "boolean"),
        ("null", "null"),
    ],
)
def test_each_json_type_has_its_own_name(text: str, name: str) -> None:
    assert jsontext.type_name(jsontext.loads(text)) == name


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "[" * 100_000, "", "{"])
def test_what_is_not_json_is_a_value_error_saying_so(text: str) -> None:
    with pytest.raises(ValueError, match="^not JSON: "):
        jsontext.loads(text.encode())


def test_a_lone_surrogate_in_a_string_is_read_as_python_s_json_reads_it() -> None:
    """Escaped or as its (not quite UTF-8) bytes: text, not a reason (the job's own parse, in
    Spark, is what judges UTF-8: ``not_utf8``)."""
    assert jsontext.loads(b'"\\ud800"') == "\ud800"
    assert jsontext.loads('"\ud800"'.encode("utf-8", "surrogatepass")) == "\ud800"


def test_a_bool_is_not_an_integer() -> None:
    assert bool not in jsontext.PYTHON_TYPES["integer"] + jsontext.PYTHON_TYPES["number"]
