"""Checkers composed by name, as Jepsen's ``checker.clj`` composes them (``compose``,
``merge-valid``).

A checker is a pure function from one subject (a run's history and tables,
:mod:`chaos.verdict`; a verdict and what the harness saw, :mod:`chaos.judge`) to its
:class:`Checked`: the findings it makes, each keeping its kind, and what it measured.
:func:`compose` runs a mapping of named checkers on one subject; a checker that raises
yields a finding of kind ``crashed`` that is ``unknown``, never a silent pass.

Validity follows Jepsen: ``True``, ``False`` or ``"unknown"``; composing ranks invalid over
unknown over valid, and a checker without findings is valid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

Validity = bool | Literal["unknown"]
UNKNOWN: Literal["unknown"] = "unknown"

_RANK: dict[Validity, int] = {True: 0, UNKNOWN: 1, False: 2}

S = TypeVar("S")


def rank(valid: Validity) -> int:
    """0 for valid, 1 for unknown, 2 for invalid."""
    try:
        return _RANK[valid]
    except KeyError:
        raise ValueError(f"validity must be True, False or 'unknown', got {valid!r}") from None


def merge_valid(*values: Validity) -> Validity:
    """Compose validities, Jepsen style: invalid over unknown over valid; nothing is valid."""
    worst: Validity = True
    for value in values:
        if rank(value) > rank(worst):
            worst = value
    return worst


@dataclass(frozen=True)
class Finding:
    """One finding. ``valid`` is what it does to the verdict: False or ``"unknown"``.

    ``kind`` groups findings: the history checkers' ``lost``, ``doubled``, ``dead``,
    ``stray_effect``, ``mismatch``, ``rejected_landed``, ``not_due``, ``unkeyed``, ``empty``
    and the tick checker's ``tick_*`` (:mod:`chaos.ticks`); the judges' ``recovery``,
    ``alerts``, ``alert_not_delivered``, ``crash``, ``interference``, ``nemesis``,
    ``evidence``, ``api_contract``, ``drain``; ``crashed`` for a checker that raised."""

    kind: str
    valid: Validity
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Checked:
    """What one checker returns: its findings and what it measured (Jepsen's other keys)."""

    findings: tuple[Finding, ...] = ()
    measures: Mapping[str, Any] = field(default_factory=dict)


Checker = Callable[[S], Checked | Iterable[Finding]]


@dataclass(frozen=True)
class Result:
    """One named checker's result: the worst of its findings' validities (valid without
    any), its findings, and its measures (empty when it crashed)."""

    name: str
    valid: Validity
    findings: tuple[Finding, ...]
    measures: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Composed:
    """Several named checkers' results on one subject, in the order they were composed."""

    results: tuple[Result, ...]

    @property
    def valid(self) -> Validity:
        return merge_valid(*(r.valid for r in self.results))

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for r in self.results for f in r.findings)

    def __getitem__(self, name: str) -> Result:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def __iter__(self) -> Iterator[Result]:
        return iter(self.results)


def run_checker(name: str, checker: Checker[S], subject: S) -> Result:
    """One checker on ``subject``; if it raises, its result is ``unknown`` with a finding
    of kind ``crashed`` saying so."""
    try:
        checked = checker(subject)
        if not isinstance(checked, Checked):
            checked = Checked(tuple(checked))
    except Exception as exc:  # a crashing checker shows nothing: unknown, never valid
        message = f"crashed: the {name} checker raised {type(exc).__name__}: {exc}"[:500]
        return Result(name, UNKNOWN, (Finding("crashed", UNKNOWN, message),))
    findings = tuple(checked.findings)
    return Result(name, merge_valid(*(f.valid for f in findings)), findings, checked.measures)


def compose(checkers: Mapping[str, Checker[S]], subject: S) -> Composed:
    """Every checker of ``checkers`` on ``subject``, by name, in order."""
    return Composed(tuple(run_checker(name, c, subject) for name, c in checkers.items()))
