"""What the job store can keep: the hostile inputs every door must refuse as the client's
error (pure)."""

import pytest

from leasework import jsonlimits
from leasework.jsonlimits import MalformedJSON, parse_json, payload_errors, storable_errors


def nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("raw", "field", "says"),
    [
        (b'{"a": NaN}', "payload.a", "is NaN, which is not JSON"),
        (b'{"a": [Infinity]}', "payload.a[0]", "is Infinity"),
        (b'{"a": -Infinity}', "payload.a", "is -Infinity"),
        (b'{"a": 1e400}', "payload.a", "too large"),
        (b'{"a": ' + b"9" * 5000 + b"}", "payload.a", "integer of 5000 digits"),
    ],
)
def test_numbers_the_store_cannot_hold_parse_into_markers_that_name_their_field(raw, field, says):
    errors = storable_errors(parse_json(raw))
    assert [(e.field, says in e.message) for e in errors] == [(field, True)], errors


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests deeper than 32"),
        (b'{"a": 1', "Expecting"),
        (b"\xff\xfe", "Expecting value|decode"),
    ],
)
def test_parse_refuses_what_is_not_json_at_all(raw, says):
    with pytest.raises(MalformedJSON, match=says):
        parse_json(raw)


@pytest.mark.parametrize(
    ("value", "field", "says"),
    [
        ({"a": "x\x00y"}, "payload.a", "NUL"),
        ({"a\x00": 1}, "payload", "key that contains a NUL"),
        ({"a": "\ud800"}, "payload.a", "surrogate"),
        ({"k" * 1001: 1}, "payload", "key longer"),
        (nested(jsonlimits.MAX_DEPTH + 1), "payload" + "[0]" * jsonlimits.MAX_DEPTH, "deeper"),
        ({"n": 10**1001}, "payload.n", "more than 1000 digits"),
        ({"f": float("nan")}, "payload.f", "nan"),
        ({"s": {1, 2}}, "payload.s", "set, which is not JSON"),
        ({1: "x"}, "payload", "non-string key"),
        ({"x y": [1, "\x00"]}, "payload['x y'][1]", "NUL"),
    ],
)
def test_storable_errors_name_the_field(value, field, says):
    errors = storable_errors(value)
    assert errors and errors[0].field == field and says in errors[0].message, errors


def test_nesting_at_the_limit_is_fine_and_sizes_are_capped():
    assert storable_errors(nested(jsonlimits.MAX_DEPTH)) == []
    half = "x" * (jsonlimits.MAX_PAYLOAD_BYTES // 2)
    big = {"a": half, "b": half}
    assert "bytes as JSON" in payload_errors(big)[0].message


def test_a_hostile_depth_does_not_overflow_the_checker():
    assert storable_errors(nested(200_000))[0].message.startswith("nests deeper")


def test_a_payload_of_more_values_than_the_limit_is_refused_and_the_walk_stops_there():
    from leasework.jsonlimits import MAX_NODES, storable_errors

    assert storable_errors([0] * (MAX_NODES - 1)) == []
    errors = storable_errors([0] * (MAX_NODES * 10))
    assert [e.field for e in errors] == ["payload"] and "more than 100000 values" in errors[
        0
    ].message


def test_the_structure_estimate_is_an_upper_bound_of_the_values_without_parsing():
    import json

    from leasework.jsonlimits import structure_estimate

    def values(v) -> int:
        if isinstance(v, list):
            return 1 + sum(values(x) for x in v)
        if isinstance(v, dict):
            return 1 + sum(values(x) for x in v.values())
        return 1

    for text in ["1", "[]", "[1,2,3]", '{"a":[{},{"b":"x,y"}]}', "[[[]],[[],[]]]", '"a,b,c"']:
        assert structure_estimate(text.encode()) >= values(json.loads(text)), text
    assert structure_estimate(b"[" + b",".join([b"0"] * 1000) + b"]") == 1001


def test_whole_numbers_is_iterative_and_keeps_the_shape():
    from leasework.jsonlimits import whole_numbers

    assert whole_numbers({"a": [1.0, 2.5, {"b": 3.0}], "c": "4.0"}) == {
        "a": [1, 2.5, {"b": 3}],
        "c": "4.0",
    }
    nested: list = [1.0]
    for _ in range(100_000):  # far past the recursion limit
        nested = [nested]
    out = whole_numbers(nested)
    for _ in range(100_000):
        out = out[0]
    assert out == [1] and isinstance(out[0], int)
