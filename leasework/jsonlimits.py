"""What the job store can keep, checked before anything is written (pure).

Postgres refuses some JSON that Python accepts: ``\\u0000`` in a string or key, lone UTF-16
surrogates, ``NaN`` and ``Infinity``; psycopg refuses NUL in text columns; very deep nesting
overflows parsers on the way. Such input is the client's error, never an outage, so every door
(HTTP submit and batch, ``enqueue``, the SQL function) checks it here first and names the
field. The limits are deliberate and documented in the README:

* nesting depth at most :data:`MAX_DEPTH` (objects and arrays);
* object keys at most :data:`MAX_KEY_CHARS` characters;
* strings at most :data:`MAX_STRING_CHARS` characters;
* integers at most :data:`MAX_INT_DIGITS` digits;
* a payload at most :data:`MAX_NODES` values (objects, arrays, strings, numbers, booleans and
  nulls; keys not counted) and at most :data:`MAX_PAYLOAD_BYTES` bytes as compact JSON.

A body is also bounded before it is parsed (:func:`structure_estimate`): the count of its
commas, brackets and braces is an upper bound of its values, so a body that could hold more
than its door allows is refused without building it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from leasework.errors import FieldError

MAX_DEPTH = 32
MAX_KEY_CHARS = 1_000
MAX_STRING_CHARS = 1_000_000
MAX_INT_DIGITS = 1_000
MAX_PAYLOAD_BYTES = 1_048_576
MAX_NODES = 100_000  # values in one payload (or result, or operator body)
MAX_RESULT_BYTES = 65_536
# values a batch body may hold, bounded before parsing by structure_estimate
MAX_BATCH_STRUCTURE = 1_000_000


class MalformedJSON(ValueError):
    """The bytes are not JSON leasework accepts (the message says why)."""


class TooDeep(MalformedJSON):
    """Nested too deeply to even parse: a limit of the body, not of one field."""


@dataclass(frozen=True)
class Unstorable:
    """A value the parser read but the store cannot keep (``NaN``, ``1e400``, an integer of
    5,000 digits): kept in place so :func:`storable_errors` names its field."""

    why: str


def _constant(name: str) -> Unstorable:
    return Unstorable(f"is {name}, which is not JSON; send a finite number or null")


def _float(text: str) -> float | Unstorable:
    value = float(text)
    if math.isinf(value):
        return Unstorable(f"is {text[:40]}, too large for a number the job store can keep")
    return value


def _int(text: str) -> int | Unstorable:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return Unstorable(f"is an integer of {digits} digits, over the limit of {MAX_INT_DIGITS}")
    return int(text)


def parse_json(raw: bytes | str) -> Any:
    """Strict JSON. ``NaN``, ``Infinity``, numbers that overflow and huge integers are parsed
    into :class:`Unstorable` markers, so the field check names where they are; nesting too deep
    for the parser raises :class:`TooDeep` instead of crashing."""
    try:
        return json.loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise TooDeep(f"nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedJSON(str(exc)) from None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which the job store cannot keep"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode"
    return None


def text_errors(field: str, text: str) -> list[FieldError]:
    """Errors of a text field stored in a ``text`` column (type, keys, ordering key)."""
    problem = _text_problem(text)
    return [FieldError(field, problem)] if problem else []


def storable_errors(
    value: Any, field: str = "payload", max_nodes: int = MAX_NODES
) -> list[FieldError]:
    """Every reason ``value`` cannot be stored as ``jsonb`` (first few, with their paths).

    Walks iteratively, so a hostile depth cannot overflow the stack here, and stops after
    ``max_nodes`` values, so a hostile width cannot make the walk long.
    """
    errors: list[FieldError] = []
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    nodes = 0
    while stack and len(errors) < 20:
        item, path, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            errors.append(
                FieldError(
                    field,
                    f"holds more than {max_nodes} values (objects, arrays, strings, numbers); "
                    "store large data elsewhere and pass a reference",
                )
            )
            break
        if isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                errors.append(FieldError(path, f"nests deeper than {MAX_DEPTH} levels"))
                continue
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        errors.append(FieldError(path, f"has a non-string key {key!r}"))
                        continue
                    child_path = f"{path}.{key}" if key.isidentifier() else f"{path}[{key!r}]"
                    if len(key) > MAX_KEY_CHARS:
                        errors.append(
                            FieldError(path, f"has a key longer than {MAX_KEY_CHARS} characters")
                        )
                    elif problem := _text_problem(key):
                        errors.append(FieldError(path, f"has a key that {problem}"))
                    stack.append((child, child_path, depth + 1))
            else:
                for index, child in enumerate(item):
                    stack.append((child, f"{path}[{index}]", depth + 1))
        elif isinstance(item, str):
            if len(item) > MAX_STRING_CHARS:
                errors.append(
                    FieldError(path, f"is a string longer than {MAX_STRING_CHARS} characters")
                )
            elif problem := _text_problem(item):
                errors.append(FieldError(path, problem))
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, Unstorable):
            errors.append(FieldError(path, item.why))
        elif isinstance(item, int):
            # digits from the bit length: str() of a huge int is itself refused by Python
            if item.bit_length() * 0.30103 > MAX_INT_DIGITS:
                errors.append(
                    FieldError(path, f"is an integer of more than {MAX_INT_DIGITS} digits")
                )
        elif isinstance(item, float):
            if not math.isfinite(item):
                errors.append(FieldError(path, f"is {item}, which JSON cannot represent"))
        else:
            errors.append(
                FieldError(
                    path,
                    f"is a {type(item).__name__}, which is not JSON; send objects, arrays, "
                    "strings, numbers, booleans or null",
                )
            )
    return errors


def compact(value: Any) -> str:
    """Compact JSON text of an already checked value."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def payload_errors(value: Any, field: str = "payload") -> list[FieldError]:
    """:func:`storable_errors`, then the size of the whole payload."""
    errors = storable_errors(value, field)
    if not errors:
        size = len(compact(value).encode())
        if size > MAX_PAYLOAD_BYTES:
            errors.append(
                FieldError(
                    field,
                    f"is {size} bytes as JSON, over the {MAX_PAYLOAD_BYTES}-byte limit; store "
                    "large data elsewhere and pass a reference",
                )
            )
    return errors


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _empty_like(container: list | dict) -> list | dict:
    return [] if isinstance(container, list) else {}


def whole_numbers(value: Any) -> Any:
    """``value`` with every float that is a whole number (``5.0``) as an int (pure; a copy):
    JSON Schema calls 5.0 an integer, and so does every door. Iterative: a value nested as
    deep as the parser allows (where a number belongs, say) cannot overflow the stack."""
    if not isinstance(value, list | dict):
        return _whole(value)
    top = _empty_like(value)
    stack: list[tuple[Any, Any]] = [(value, top)]  # (a container, its copy being filled)
    while stack:
        source, copy = stack.pop()
        items = enumerate(source) if isinstance(source, list) else source.items()
        for key, child in items:
            if isinstance(child, list | dict):
                new = _empty_like(child)
                stack.append((child, new))
            else:
                new = _whole(child)
            if isinstance(copy, list):
                copy.append(new)
            else:
                copy[key] = new
    return top


def structure_estimate(raw: bytes) -> int:
    """An upper bound of the values in the JSON text ``raw``, without parsing it: each value
    after the first in a container follows a comma, and each container opens with a bracket
    or a brace (commas and brackets inside strings make it larger, never smaller). A few
    milliseconds for 16 MiB."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
