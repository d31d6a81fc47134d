"""The history of a chaos run, in Jepsen's shape: a sequence of operations, written to disk as
JSON lines while the run goes on and read back by the checker.

Every client operation is an ``invoke`` followed, from the same ``process``, by exactly one
completion:

- ``ok``: it happened (a submit answered 202);
- ``fail``: it certainly did not happen (a 4xx answer);
- ``info``: unknown, it may or may not have happened (a timeout or a connection error after
  the request may have been sent). The workload retries an unknown submit with the same
  ``Idempotency-Key``, as a new invocation.

Nemesis operations use ``f = "nemesis"``, ``process = "nemesis"`` and a value
``{"fault": name, "action": "start" | "stop", "target": ...}``; they are paired the same way.

The history is the only link between running and checking: the checker never looks at
anything the run did not write down (apart from the tables it reads once the system is quiet).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
# how an invocation completed: it happened, it certainly did not, or unknown
OpOutcome = Literal["ok", "fail", "info"]
TYPES: tuple[str, ...] = ("invoke", "ok", "fail", "info")
COMPLETIONS: frozenset[str] = frozenset({"ok", "fail", "info"})

SUBMIT = "submit"
NEMESIS = "nemesis"
NEMESIS_PROCESS = "nemesis"
START, STOP = "start", "stop"

FIELDS: tuple[str, ...] = ("index", "time", "process", "type", "f", "value", "error")


class HistoryError(ValueError):
    """A history record or file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class Op:
    """One operation record.

    ``time`` is in seconds on a monotonic clock, relative to the start of the run. ``value``
    must hold JSON values only (dicts, lists, strings, numbers, booleans, None) so that a
    record written and read back compares equal.
    """

    index: int
    time: float
    process: int | str
    type: OpType
    f: str
    value: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise HistoryError(f"op {self.index}: type {self.type!r} is not one of {TYPES}")
        if not isinstance(self.value, dict):
            raise HistoryError(f"op {self.index}: value must be a dict, got {self.value!r}")
        if isinstance(self.time, bool) or not isinstance(self.time, int | float):
            raise HistoryError(f"op {self.index}: time must be a number, got {self.time!r}")
        if not math.isfinite(self.time):
            raise HistoryError(f"op {self.index}: time must be finite, got {self.time!r}")

    @property
    def is_invoke(self) -> bool:
        return self.type == "invoke"

    @property
    def is_nemesis(self) -> bool:
        return self.f == NEMESIS

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}

    def to_json(self) -> str:
        """One line of JSON, without the newline."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Op:
        missing = [name for name in FIELDS if name not in data]
        if missing:
            raise HistoryError(f"record lacks {', '.join(missing)}: {dict(data)!r}")
        extra = sorted(set(data) - set(FIELDS))
        if extra:
            raise HistoryError(f"record has unknown fields {', '.join(extra)}")
        index, process = data["index"], data["process"]
        if isinstance(index, bool) or not isinstance(index, int):
            raise HistoryError(f"index must be an integer, got {index!r}")
        if isinstance(process, bool) or not isinstance(process, int | str):
            raise HistoryError(f"process must be an integer or a string, got {process!r}")
        if not isinstance(data["f"], str):
            raise HistoryError(f"f must be a string, got {data['f']!r}")
        if data["error"] is not None and not isinstance(data["error"], str):
            raise HistoryError(f"error must be a string or null, got {data['error']!r}")
        return cls(
            index=index,
            time=data["time"],
            process=process,
            type=data["type"],
            f=data["f"],
            value=data["value"],
            error=data["error"],
        )

    @classmethod
    def from_json(cls, line: str) -> Op:
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HistoryError(f"a record must be a JSON object, got {type(data).__name__}")
        return cls.from_dict(data)


# ---------------------------------------------------------------- values


def submit_value(
    key: str,
    job_type: str,
    payload: Any,
    *,
    delay: float = 0.0,
    max_attempts: int | None = None,
    may_die: bool = False,
) -> dict[str, Any]:
    """The value of a submit invocation.

    ``delay`` is the due time, in seconds after the submit (0: due now). ``may_die`` says
    whether ending ``dead`` is an acceptable outcome for this job (a ``fail`` job with fewer
    attempts than failures).
    """
    value: dict[str, Any] = {
        "key": key,
        "type": job_type,
        "payload": payload,
        "delay": delay,
        "may_die": may_die,
    }
    if max_attempts is not None:
        value["max_attempts"] = max_attempts
    return value


def submit_ok_value(invoked: Mapping[str, Any], job_id: str, status: str) -> dict[str, Any]:
    """The value of an ``ok`` submit completion: the invocation's value plus job id and status."""
    return {**invoked, "job_id": str(job_id), "status": status}


def nemesis_value(
    fault: str, action: Literal["start", "stop"], target: str | None, **params: Any
) -> dict[str, Any]:
    value: dict[str, Any] = {"fault": fault, "action": action, "target": target}
    if params:
        value["params"] = params
    return value


# ---------------------------------------------------------------- writing and reading


class HistoryWriter:
    """Appends operations to a file as JSON lines, flushing after every line, so that a run
    that dies still leaves every operation it recorded on disk."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def append(self, op: Op) -> None:
        if self._file is None:
            raise HistoryError(f"{self.path}: the writer is closed")
        self._file.write(op.to_json() + "\n")
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_history(path: str | os.PathLike[str], ops: Iterable[Op]) -> None:
    """Write a whole history (replacing the file)."""
    Path(path).write_text("".join(op.to_json() + "\n" for op in ops), encoding="utf-8")


def read_history(path: str | os.PathLike[str]) -> list[Op]:
    """Load a history written by :class:`HistoryWriter`.

    A malformed line raises :class:`HistoryError` naming the file and line, except a final
    line without its newline: the writer puts the newline last, so such a line can only be a
    record the run died while writing; it is dropped.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    torn_tail = not text.endswith("\n") and text != ""
    ops: list[Op] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ops.append(Op.from_json(line))
        except HistoryError as exc:
            if torn_tail and number == len(lines):
                break
            raise HistoryError(f"{path}:{number}: {exc}") from None
    return ops


# ---------------------------------------------------------------- recording


class Recorder:
    """Stamps operations with consecutive indices and run-relative monotonic times, keeps
    them in memory and, given a writer, appends each one to disk as it happens.

    ``clock`` returns seconds on a monotonic clock; the first reading is time zero.
    """

    def __init__(
        self,
        writer: HistoryWriter | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.writer = writer
        self.clock = clock
        self.origin = clock()
        self.ops: list[Op] = []

    def now(self) -> float:
        return self.clock() - self.origin

    def record(
        self,
        process: int | str,
        op_type: OpType,
        f: str,
        value: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> Op:
        op = Op(len(self.ops), self.now(), process, op_type, f, dict(value or {}), error)
        self.ops.append(op)
        if self.writer is not None:
            self.writer.append(op)
        return op

    def invoke(self, process: int | str, f: str, value: Mapping[str, Any]) -> Op:
        return self.record(process, "invoke", f, value)

    def complete(
        self,
        invocation: Op,
        op_type: OpOutcome,
        value: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> Op:
        """The completion of ``invocation``; its value defaults to the invocation's."""
        if op_type not in COMPLETIONS:
            raise HistoryError(f"{op_type!r} is not a completion type")
        value = invocation.value if value is None else value
        return self.record(invocation.process, op_type, invocation.f, value, error)


# ---------------------------------------------------------------- reading a history


@dataclass(frozen=True)
class Pair:
    """An invocation and its completion (None when the history ends before it completes)."""

    invoke: Op
    completion: Op | None

    @property
    def type(self) -> str:
        """The completion's type, or ``info`` for an invocation that never completed."""
        return self.completion.type if self.completion is not None else "info"

    @property
    def time(self) -> float:
        """When the operation's outcome was known (the invocation's time if it never was)."""
        return self.completion.time if self.completion is not None else self.invoke.time


def pairs(ops: Sequence[Op]) -> list[Pair]:
    """Pair each invocation with the next completion of the same process, in history order.

    A completion with no open invocation is paired with itself as the invocation (histories
    from other tools sometimes record only completions for the nemesis); an invocation
    followed by another invocation of the same process stays unpaired.
    """
    open_by_process: dict[int | str, int] = {}
    result: list[Pair] = []
    for op in ops:
        if op.is_invoke:
            # an earlier open invocation of this process stays unpaired
            open_by_process[op.process] = len(result)
            result.append(Pair(op, None))
        else:
            slot = open_by_process.pop(op.process, None)
            if slot is None:
                result.append(Pair(op, op))
            else:
                result[slot] = Pair(result[slot].invoke, op)
    return result


@dataclass(frozen=True)
class FaultWindow:
    """A fault from its start to its stop (``stop`` None: never healed in the history).
    Times are those of the completions: when the fault was in effect, when it was healed."""

    fault: str
    target: str | None
    start: float
    stop: float | None

    @property
    def label(self) -> str:
        return f"{self.fault} {self.target}" if self.target else self.fault


def fault_windows(ops: Sequence[Op]) -> list[FaultWindow]:
    """The nemesis windows of a history, in order of start. A stop closes the earliest open
    start of the same fault and target; a stop with no open start is a window of its own
    starting at the stop."""
    opened: dict[tuple[str, str | None], list[int]] = {}
    windows: list[FaultWindow] = []
    for pair in pairs([op for op in ops if op.is_nemesis]):
        value = pair.invoke.value
        fault, target, action = value.get("fault"), value.get("target"), value.get("action")
        if not isinstance(fault, str):
            continue
        key = (fault, target)
        if action == START:
            opened.setdefault(key, []).append(len(windows))
            windows.append(FaultWindow(fault, target, pair.time, None))
        elif action == STOP:
            queue = opened.get(key)
            if queue:
                slot = queue.pop(0)
                start = windows[slot].start
                windows[slot] = FaultWindow(fault, target, start, max(start, pair.time))
            else:
                windows.append(FaultWindow(fault, target, pair.time, pair.time))
    return sorted(windows, key=lambda w: (w.start, w.fault, str(w.target)))


def submits_by_key(ops: Sequence[Op]) -> dict[str, list[Pair]]:
    """Every submit pair grouped by its Idempotency-Key, keys in order of first invocation."""
    grouped: dict[str, list[Pair]] = {}
    for pair in pairs([op for op in ops if op.f == SUBMIT]):
        key = pair.invoke.value.get("key")
        if isinstance(key, str):
            grouped.setdefault(key, []).append(pair)
    return grouped
