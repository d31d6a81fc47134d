"""Unique jobs, the pure part: what a request or a job type asks (:class:`Unique`), how it is
checked, and the spec every door hands the insert.

A unique job carries a key, computed in one place, in SQL (``leasework_unique_key`` of
migration 0007, inside ``leasework_job_requests``), from its type, the values of the chosen
top-level payload fields and, with a period, the period's bucket of its ``run_at``; and the
set of states in which the key holds (always every unfinished one). A partial unique index
over the keys of the jobs in their states is the rule; the insert's ``ON CONFLICT DO NOTHING``
makes a second inserter wait for the first's transaction and then either insert (the first
rolled back) or answer ``duplicate`` with the holder's id (it committed). Nothing here
touches the store: the doors call :func:`spec_errors`, :func:`payload_errors` and
:meth:`Unique.spec`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from leasework.errors import FieldError
from leasework.states import TERMINAL, Status

# the states every unique key holds in: a job between them (the promoter, the claim, the
# reaper move it) can never meet the index, and a second job of the key is refused while
# the first is not finished
UNFINISHED: frozenset[Status] = frozenset(Status) - TERMINAL
# the bit of each state in jobs.unique_states (leasework_unique_bit in migration 0007)
STATE_BITS: Mapping[Status, int] = {
    Status.SCHEDULED: 1,
    Status.QUEUED: 2,
    Status.RUNNING: 4,
    Status.SUCCEEDED: 8,
    Status.FAILED: 16,
    Status.DEAD: 32,
    Status.CANCELLED: 64,
}
MAX_FIELDS = 32
MAX_FIELD_CHARS = 200
MAX_PERIOD_SECONDS = 366 * 86_400
SPEC_FIELDS = frozenset({"fields", "period_seconds", "states"})


class UniqueError(ValueError):
    """A :class:`Unique` that cannot be kept; the message says what to change."""


def _state_order(status: Status) -> int:
    return STATE_BITS[status]


def states_of(mask: int) -> list[Status]:
    """The states of a ``unique_states`` bitmask, in the order of :data:`STATE_BITS`."""
    return [s for s, bit in STATE_BITS.items() if mask & bit]


def mask_of(states: Iterable[Status]) -> int:
    return sum({STATE_BITS[s] for s in states})


def key_view(key: bytes | None, mask: int | None, status: Status) -> dict[str, Any] | None:
    """A job's unique key as the api and the console show it: the key (hex), the states it
    holds it in, and whether it holds it now (in ``status``); None: it asked for none."""
    if key is None or mask is None:
        return None
    states = states_of(mask)
    return {"key": key.hex(), "states": [str(s) for s in states], "holds": status in states}


def spec_errors(spec: Any, field: str = "unique") -> list[FieldError]:
    """Why ``spec`` (JSON: ``{"fields": [...], "period_seconds": n, "states": [...]}``) is
    not a uniqueness a job can ask; empty when it is."""
    if not isinstance(spec, dict):
        return [
            FieldError(
                field,
                'must be an object such as {"fields": ["customer_id"], "period_seconds": 3600}',
            )
        ]
    errors = [
        FieldError(f"{field}.{name}", "unknown field; allowed: fields, period_seconds, states")
        for name in sorted(set(spec) - SPEC_FIELDS, key=str)
    ]
    fields = spec.get("fields")
    if (
        not isinstance(fields, list)
        or len(fields) > MAX_FIELDS
        or not all(isinstance(f, str) and 1 <= len(f) <= MAX_FIELD_CHARS for f in fields)
        or len(set(fields)) != len(fields)
    ):
        errors.append(
            FieldError(
                f"{field}.fields",
                f"required: a list of up to {MAX_FIELDS} distinct top-level payload field names "
                f"of 1-{MAX_FIELD_CHARS} characters ([] for one job of the type at a time)",
            )
        )
    period = spec.get("period_seconds")
    if period is not None and (
        isinstance(period, bool)
        or not isinstance(period, int | float)
        or period != int(period)
        or not 1 <= period <= MAX_PERIOD_SECONDS
    ):
        errors.append(
            FieldError(
                f"{field}.period_seconds",
                f"must be a whole number of seconds from 1 to {MAX_PERIOD_SECONDS} (366 days)",
            )
        )
    states = spec.get("states")
    if states is not None:
        errors.extend(_states_errors(states, f"{field}.states"))
    return errors


def _states_errors(states: Any, field: str) -> list[FieldError]:
    names = {s.value for s in Status}
    if (
        not isinstance(states, list)
        or not all(isinstance(s, str) and s in names for s in states)
        or len(set(states)) != len(states)
    ):
        return [FieldError(field, f"must be a list of distinct job states: {', '.join(names)}")]
    missing = sorted(UNFINISHED - {Status(s) for s in states}, key=_state_order)
    if missing:
        return [
            FieldError(
                field,
                f"leaves out {', '.join(missing)}: a unique key holds in every unfinished state "
                "(scheduled, queued, running, failed); list them all, and add succeeded, dead "
                "or cancelled to keep the key after a job ends that way",
            )
        ]
    return []


@dataclass(frozen=True)
class Unique:
    """Uniqueness a job type declares (``@app.job(..., unique=Unique(...))``) or one submit
    asks (``enqueue(..., unique=...)``, the HTTP body's ``unique``): at most one job of the
    type with the same values of ``fields`` (top-level payload fields; empty: the type alone)
    among the jobs in ``states`` (default: the unfinished ones, which it must include) and,
    with ``period``, whose run_at falls in the same period (buckets counted from the Unix
    epoch in UTC: an hour is a UTC clock hour). A second submit of the key is answered
    ``duplicate`` with the existing job's id."""

    fields: tuple[str, ...] = ()
    period: timedelta | None = None
    states: frozenset[Status] = UNFINISHED

    def __post_init__(self) -> None:
        fields = self.fields
        if isinstance(fields, str):  # ("customer_id") without its comma
            fields = (fields,)
        object.__setattr__(self, "fields", tuple(fields))
        try:
            states = frozenset(Status(s) for s in self.states)
        except (TypeError, ValueError):
            raise UniqueError(
                f"unique states {self.states!r}: give job states "
                f"({', '.join(s.value for s in Status)})"
            ) from None
        object.__setattr__(self, "states", states)
        if self.period is not None and not isinstance(self.period, timedelta):
            raise UniqueError(f"unique period must be a timedelta, got {self.period!r}")
        if errors := spec_errors(self._raw()):
            raise UniqueError("; ".join(f"{e.field}: {e.message}" for e in errors))

    def _raw(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"fields": list(self.fields)}
        if self.period is not None:
            seconds = self.period.total_seconds()
            raw["period_seconds"] = int(seconds) if seconds == int(seconds) else seconds
        raw["states"] = sorted((s.value for s in self.states), key=lambda v: STATE_BITS[Status(v)])
        return raw

    def spec(self) -> dict[str, Any]:
        """The JSON the insert takes (``unique`` of a request, ``job_types.unique_policy``)."""
        return self._raw()

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Unique:
        """From JSON already checked by :func:`spec_errors`."""
        period = spec.get("period_seconds")
        return cls(
            fields=tuple(spec["fields"]),
            period=timedelta(seconds=period) if period is not None else None,
            states=frozenset(Status(s) for s in spec.get("states") or UNFINISHED),
        )


def payload_errors(
    unique: Unique, payload: Any, properties: Iterable[str] | None = None, field: str = "unique"
) -> list[FieldError]:
    """Why ``payload`` cannot carry ``unique``'s key: a field not among the payload model's
    ``properties`` (when it has a model), a payload that is not an object, or a field the
    payload lacks."""
    errors = fields_errors(unique, properties, field)
    if errors or not unique.fields:
        return errors
    if not isinstance(payload, dict):
        return [FieldError("payload", f"must be an object holding {_names(unique.fields)}")]
    missing = [f for f in unique.fields if f not in payload]
    if missing:
        return [
            FieldError(
                f"payload.{name}",
                f"required: {field} is made of this field, and the payload has none",
            )
            for name in missing
        ]
    return []


def fields_errors(
    unique: Unique, properties: Iterable[str] | None, field: str = "unique"
) -> list[FieldError]:
    """Fields of ``unique`` that the payload model (its top-level ``properties``; None: no
    model, any field) does not have."""
    if properties is None:
        return []
    known = set(properties)
    unknown = [f for f in unique.fields if f not in known]
    if not unknown:
        return []
    return [
        FieldError(
            f"{field}.fields",
            f"{_names(unknown)} not a field of the payload; its fields: "
            f"{', '.join(sorted(known)) or 'none'}",
        )
    ]


def _names(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def schema_properties(schema: Mapping[str, Any]) -> list[str] | None:
    """The top-level fields a payload JSON Schema names (None: it names none, any field)."""
    properties = schema.get("properties")
    if isinstance(properties, dict):
        return list(properties)
    return None
