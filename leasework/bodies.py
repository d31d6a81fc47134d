"""Request bodies: strict JSON under a size limit, and the problems that refuse them."""

from __future__ import annotations

from typing import Any

from quart import request

from leasework.errors import FieldError
from leasework.jsonlimits import MalformedJSON, TooDeep, parse_json
from leasework.problems import Problem


def invalid(errors: list[FieldError], what: str = "fix these fields and resubmit") -> Problem:
    names = ", ".join(dict.fromkeys(e.field for e in errors[:20]))
    return Problem(
        422,
        "invalid-fields",
        "Invalid fields",
        f"{what}: {names}; nothing was written",
        errors=[e.as_dict() for e in errors],
    )


async def json_body(limit: int) -> Any:
    """The body of the current Quart request as JSON (see :func:`parse_body`)."""
    return parse_body(request.content_type, await request.get_data(as_text=False), limit)


def parse_body(content_type: str | None, raw: bytes, limit: int) -> Any:
    """A request body as strict JSON; every refusal is a :class:`Problem`."""
    mimetype = (content_type or "").split(";", 1)[0].strip().lower()
    if mimetype != "application/json":
        raise Problem(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            f"send JSON with Content-Type: application/json (got {content_type or 'none'})",
        )
    if len(raw) > limit:
        raise body_too_large(limit)
    try:
        return parse_json(raw)
    except TooDeep as exc:  # JSON, but beyond any field's limit: the body is the field
        raise invalid([FieldError("(body)", str(exc))]) from None
    except MalformedJSON as exc:
        raise Problem(
            400,
            "malformed-json",
            "Malformed JSON",
            f"the body is not valid JSON: {exc}; nothing was written",
        ) from None


def body_too_large(limit: int) -> Problem:
    return Problem(
        413,
        "body-too-large",
        "Request body too large",
        f"the body exceeds {limit} bytes; send a smaller payload (store large data elsewhere "
        "and pass a reference), or split a batch",
    )
