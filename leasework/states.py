"""The job state machine, as data.

``scheduled`` and ``queued`` are waiting states, ``running`` is held by one worker under a
fence, ``failed`` waits for its retry, and ``succeeded``, ``dead`` and ``cancelled`` are
terminal: no loop of the system ever moves them. Only an operator's retry
(``POST /jobs/{id}/retry``) brings a ``dead`` or ``cancelled`` job back to ``queued``; that
move is a table of its own, :data:`REQUEUES`, so no loop that asks "what can become queued"
(the promoter) is ever offered a finished job. Every change of status goes through
:func:`transition`, which raises on a move the tables do not allow.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"


TRANSITIONS: dict[Status, frozenset[Status]] = {
    # due time reached -> queued; cancel before it ran -> cancelled
    Status.SCHEDULED: frozenset({Status.QUEUED, Status.CANCELLED}),
    # a worker claims it; poison goes straight to dead; cancel while waiting; a worker whose
    # app does not know the type (a rolling deploy) defers it to a later run_at
    Status.QUEUED: frozenset({Status.RUNNING, Status.DEAD, Status.CANCELLED, Status.SCHEDULED}),
    # the handler's outcome; a lost lease (reaper) also lands in failed or dead
    Status.RUNNING: frozenset({Status.SUCCEEDED, Status.FAILED, Status.DEAD, Status.CANCELLED}),
    # the retry comes due -> queued (the promoter); cancel while waiting for the retry
    Status.FAILED: frozenset({Status.QUEUED, Status.CANCELLED}),
    Status.SUCCEEDED: frozenset(),
    Status.DEAD: frozenset(),
    Status.CANCELLED: frozenset(),
}

TERMINAL: frozenset[Status] = frozenset(s for s, nexts in TRANSITIONS.items() if not nexts)

# an operator's retry: a finished job that did not succeed starts again with a fresh budget
REQUEUES: dict[Status, frozenset[Status]] = {
    Status.DEAD: frozenset({Status.QUEUED}),
    Status.CANCELLED: frozenset({Status.QUEUED}),
}
RETRYABLE: frozenset[Status] = frozenset(REQUEUES)
WAITING: frozenset[Status] = frozenset({Status.SCHEDULED, Status.QUEUED, Status.FAILED})


class IllegalTransition(ValueError):
    """A job was asked to move between two states the state machine does not connect."""

    def __init__(self, current: Status, target: Status) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (terminal)"
        super().__init__(f"job cannot go from {current} to {target}; {current} may go to {allowed}")
        self.current = current
        self.target = target


def transition(current: Status | str, target: Status | str, *, requeue: bool = False) -> Status:
    """Return ``target`` if the move is allowed, else raise :class:`IllegalTransition`.
    ``requeue=True`` also allows an operator's retry (:data:`REQUEUES`)."""
    current, target = Status(current), Status(target)
    allowed = TRANSITIONS[current] | (REQUEUES.get(current, frozenset()) if requeue else set())
    if target not in allowed:
        raise IllegalTransition(current, target)
    return target


def sources_of(target: Status) -> tuple[Status, ...]:
    """Every state from which ``target`` can be reached; the store uses it in its WHERE clauses."""
    return tuple(sorted(s for s, nexts in TRANSITIONS.items() if target in nexts))
