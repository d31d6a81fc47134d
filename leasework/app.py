"""Applications: the user's job types, declared on a :class:`App` with ``@app.job``.

::

    app = leasework.App()

    @app.job("send_receipt", max_attempts=5, timeout=30, backoff=(2, 600))
    async def send_receipt(ctx: leasework.JobContext, payload: Receipt) -> dict:
        ...

A handler is a function (``async def`` or plain ``def``, run in the lane ``runs_in`` names:
:mod:`leasework.lanes`) of a :class:`~leasework.context.JobContext` and, optionally, a
payload. The payload's annotation (a pydantic model, a dataclass, a TypedDict, or any type
pydantic's ``TypeAdapter`` understands) validates the JSON at every door and decodes it for the
handler; an unannotated payload is the raw JSON. Per-type policy (attempts, timeout, backoff,
which exceptions are permanent) sits on the decorator.

Workers and the api load an app by name: ``module:attribute`` (several, comma-separated, are
merged), from ``--app`` or ``LEASEWORK_APP``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import sys
import typing
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pydantic
import pydantic_core

from leasework import queues
from leasework.errors import AppError, AppLoadError, FieldError, Permanent
from leasework.job import MAX_ATTEMPTS, MAX_TIMEOUT_SECONDS, TYPE_NAME_PATTERN
from leasework.jsonlimits import whole_numbers
from leasework.lanes import Lane, lane_of
from leasework.queues import priorities
from leasework.rates import Rate, parse_rate
from leasework.schedules import DEFAULT_GRACE, CatchUp, Definition, Overlap, ScheduleError
from leasework.unique import Unique, fields_errors, schema_properties

_UNSET: Any = object()


def _seconds(name: str, value: float | timedelta) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise AppError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(seconds)


def pydantic_field_errors(exc: pydantic.ValidationError, prefix: str) -> list[FieldError]:
    """pydantic's own errors as :class:`FieldError` with dotted paths under ``prefix``."""
    errors = []
    for error in exc.errors(include_url=False):
        path = prefix
        for part in error.get("loc", ()):
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        errors.append(FieldError(path, error.get("msg", "invalid")))
    return errors


class JobType:
    """One job type of an app: its handler, its payload type and its policy.

    Calling it calls the handler (handy in tests); :meth:`decode` turns stored JSON into the
    handler's payload argument.
    """

    def __init__(
        self,
        name: str,
        handler: Callable[..., Any],
        *,
        payload: Any = _UNSET,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        backoff: tuple[float | timedelta, float | timedelta] | None = None,
        permanent: tuple[type[BaseException], ...] = (),
        unique: Unique | None = None,
        queue: str | None = None,
        concurrency: int | None = None,
        concurrency_key: str | None = None,
        rate: str | None = None,
        rate_burst: int = 1,
        rate_key: str | None = None,
        priority: int | None = None,
        runs_in: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not TYPE_NAME_PATTERN.match(name):
            raise AppError(
                f"job type name {name!r} is invalid: use 1-100 letters, digits and _ . : -"
            )
        if not callable(handler):
            raise AppError(f"the handler of {name!r} must be a function, got {handler!r}")
        self.name = name
        self.handler = handler
        self.lane = lane_of(name, handler, runs_in)
        self.description = inspect.getdoc(handler)
        self.takes_payload, annotation = _payload_annotation(name, handler, payload)
        self.adapter: pydantic.TypeAdapter | None = (
            None
            if annotation in (Any, object, inspect.Parameter.empty)
            else _adapter(name, annotation)
        )
        if max_attempts is not None and (
            isinstance(max_attempts, bool)
            or not isinstance(max_attempts, int)
            or not 1 <= max_attempts <= MAX_ATTEMPTS
        ):
            raise AppError(
                f"{name}: max_attempts must be an integer from 1 to {MAX_ATTEMPTS}, "
                f"got {max_attempts!r}"
            )
        self.max_attempts = max_attempts
        self.timeout_seconds: int | None = None
        if timeout is not None:
            seconds = math.ceil(_seconds(f"{name}: timeout", timeout))
            if seconds > MAX_TIMEOUT_SECONDS:
                raise AppError(f"{name}: timeout is at most {MAX_TIMEOUT_SECONDS} seconds")
            self.timeout_seconds = seconds
        self.backoff: tuple[float, float] | None = None
        if backoff is not None:
            try:
                base, cap = backoff
            except (TypeError, ValueError):
                raise AppError(
                    f"{name}: backoff is (base, cap) in seconds, got {backoff!r}"
                ) from None
            base_s, cap_s = _seconds(f"{name}: backoff base", base), _seconds(f"{name}: cap", cap)
            if cap_s < base_s:
                raise AppError(f"{name}: backoff cap {cap_s:g}s is below its base {base_s:g}s")
            self.backoff = (base_s, cap_s)
        for exc_type in permanent:
            if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
                raise AppError(f"{name}: permanent= takes exception classes, got {exc_type!r}")
        self.permanent = tuple(permanent)
        if unique is not None and not isinstance(unique, Unique):
            raise AppError(f"{name}: unique= takes a leasework.Unique, got {unique!r}")
        if unique is not None and (errors := fields_errors(unique, self.payload_fields())):
            raise AppError(f"{name}: unique: {errors[0].message}")
        self.unique = unique
        self._set_place(queue, priority)
        self._set_limits(concurrency, concurrency_key, rate, rate_burst, rate_key)

    def _set_place(self, queue: str | None, priority: int | None) -> None:
        """Check and keep the queue its jobs wait in and their priority there (see
        :meth:`App.job`)."""
        if queue is not None and (problem := queues.name_error(queue)) is not None:
            raise AppError(f"{self.name}: queue {queue!r} {problem}")
        self.queue = queue  # None: the default queue
        if priority is not None and (problem := priorities.priority_error(priority)) is not None:
            raise AppError(f"{self.name}: priority {priority!r} {problem}")
        self.priority = priority  # None: the highest, 0 (leasework.queues.priorities)

    def _set_limits(
        self,
        concurrency: int | None,
        concurrency_key: str | None,
        rate: str | None,
        rate_burst: int,
        rate_key: str | None,
    ) -> None:
        """Check and keep its concurrency and rate limits (see :meth:`App.job`)."""
        name = self.name
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise AppError(
                f"{name}: concurrency is a whole number of at least 1, got {concurrency!r}"
            )
        if concurrency_key is not None:
            if concurrency is None:
                raise AppError(f"{name}: concurrency_key needs concurrency= (the limit per key)")
            self._check_key_field("concurrency_key", concurrency_key)
        # at most `concurrency` of its jobs run at once across all workers, per value of the
        # payload field `concurrency_key` (or in all), enforced by the claim's stamp
        # (leasework/store/worker.py STAMP)
        self.concurrency = concurrency
        self.concurrency_key = concurrency_key
        self.rate: Rate | None = None
        if rate is not None:
            try:
                self.rate = parse_rate(rate, rate_burst, rate_key)
            except ValueError as exc:
                raise AppError(f"{name}: {exc}") from None
        elif rate_key is not None or rate_burst != 1:
            raise AppError(f'{name}: rate_key and rate_burst need rate= (e.g. rate="10/s")')
        if rate_key is not None:
            self._check_key_field("rate_key", rate_key)

    def _check_key_field(self, option: str, field: object) -> None:
        fields = self.payload_fields()
        if not isinstance(field, str) or (fields is not None and field not in fields):
            raise AppError(
                f"{self.name}: {option} {field!r} is not a field of its payload"
                + (f" (its fields: {', '.join(fields)})" if fields else "")
            )

    def concurrency_spec(self) -> dict[str, Any] | None:
        """The JSON of its concurrency limit (``job_types.concurrency``), None without one."""
        if self.concurrency is None:
            return None
        return {"limit": self.concurrency, "key": self.concurrency_key}

    def __repr__(self) -> str:
        return f"<JobType {self.name}>"

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler here, in this thread (a plain function's too): for tests."""
        value = self.handler(*args, **kwargs)
        return await value if inspect.isawaitable(value) else value

    # ------------------------------------------------------------ payloads

    def payload_errors(self, payload: Any, field: str = "payload") -> list[FieldError]:
        """Why ``payload`` (JSON) is not a valid payload of this type; empty when it is.

        Checked as the OpenAPI document describes it: strict JSON (no ``"5"`` for a number, no
        ``1`` for a boolean, pydantic's strict mode on the JSON text), a whole number such as
        ``5.0`` being the integer JSON Schema says it is. The worker decodes leniently, so a
        payload admitted here always decodes there."""
        if self.adapter is None:
            return []
        try:
            text = json.dumps(whole_numbers(payload), allow_nan=False)
        except (TypeError, ValueError):  # not plain JSON (refused elsewhere): check as Python
            text = None
        try:
            if text is None:
                self.adapter.validate_python(payload)
            else:
                self.adapter.validate_json(text, strict=True)
        except pydantic.ValidationError as exc:
            return pydantic_field_errors(exc, field)
        return []

    def decode(self, payload: Any) -> Any:
        """The handler's payload argument from stored JSON; raises pydantic's
        ``ValidationError`` when it does not fit (the worker treats that as permanent)."""
        return payload if self.adapter is None else self.adapter.validate_python(payload)

    def payload_schema(self) -> dict[str, Any]:
        """JSON Schema of the payload (``{}``: any JSON)."""
        if self.adapter is None:
            return {}
        return self.adapter.json_schema()

    def payload_fields(self) -> list[str] | None:
        """The top-level fields the payload model names (None: no model, or one that names
        none: any field)."""
        return schema_properties(self.payload_schema())

    def to_json(self, payload: Any) -> Any:
        """A Python payload (model instance, dataclass, dict with dates...) as plain JSON
        values; raises ``ValueError`` for what has no JSON form."""
        try:
            if self.adapter is not None and not isinstance(
                payload, dict | list | str | int | float
            ):
                return self.adapter.dump_python(payload, mode="json")
            return pydantic_core.to_jsonable_python(payload)
        except (ValueError, pydantic.ValidationError) as exc:  # serialisation errors included
            raise ValueError(f"has no JSON form: {exc}") from None

    def is_permanent(self, exc: BaseException) -> bool:
        """Whether ``exc`` means "retrying cannot help": :class:`Permanent`, one of the
        type's ``permanent`` classes, or a group made only of such."""
        if isinstance(exc, BaseExceptionGroup):
            return all(self.is_permanent(inner) for inner in exc.exceptions)
        return isinstance(exc, (Permanent, *self.permanent))


def _payload_annotation(name: str, handler: Callable, explicit: Any) -> tuple[bool, Any]:
    params = list(inspect.signature(handler).parameters.values())
    if len(params) not in (1, 2) or any(
        p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
    ):
        raise AppError(
            f"the handler of {name!r} must take (ctx) or (ctx, payload), got "
            f"({', '.join(p.name for p in params)})"
        )
    if len(params) == 1:
        if explicit is not _UNSET:
            raise AppError(f"{name}: payload= given but the handler takes no payload argument")
        return False, Any
    if explicit is not _UNSET:
        return True, explicit
    try:
        hints = typing.get_type_hints(handler, include_extras=True)
    except (NameError, TypeError) as exc:
        raise AppError(
            f"{name}: cannot resolve the payload annotation ({exc}); define the type at module "
            "level or pass it explicitly: @app.job(..., payload=MyModel)"
        ) from None
    return True, hints.get(params[1].name, Any)


def _adapter(name: str, annotation: Any) -> pydantic.TypeAdapter:
    try:
        adapter = pydantic.TypeAdapter(annotation)
        adapter.json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        raise AppError(
            f"{name}: pydantic cannot validate payloads of {annotation!r}: {exc}"
        ) from None
    return adapter


class App:
    """A set of job types. Declare them with :meth:`job`; merge apps with :meth:`include`."""

    def __init__(self, name: str = "app") -> None:
        self.name = name
        self._types: dict[str, JobType] = {}
        self._schedules: dict[str, Definition] = {}
        # lane -> "start"/"stop" -> hooks, run in the lane by each worker (leasework.lanes)
        self.lane_hooks: dict[Lane, dict[str, list[Callable[[], Any]]]] = {}

    def __repr__(self) -> str:
        return f"<leasework.App {self.name}: {', '.join(self.names) or 'no job types'}>"

    def job(
        self,
        name: str | None = None,
        *,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        backoff: tuple[float | timedelta, float | timedelta] | None = None,
        permanent: tuple[type[BaseException], ...] = (),
        payload: Any = _UNSET,
        schedule: str | None = None,
        unique: Unique | None = None,
        queue: str | None = None,
        concurrency: int | None = None,
        concurrency_key: str | None = None,
        rate: str | None = None,
        rate_burst: int = 1,
        rate_key: str | None = None,
        priority: int | None = None,
        runs_in: str | None = None,
    ) -> Callable[[Callable[..., Any]], JobType]:
        """Declare a job type. ``name`` defaults to the function's name; ``max_attempts``,
        ``timeout`` (seconds) and ``backoff`` (base, cap in seconds) default to the process
        settings when left out; ``permanent`` lists exceptions that go straight to ``dead``
        (``leasework.Permanent`` always does); ``payload`` overrides the annotation.
        ``schedule``, a cron expression, also declares a schedule of the type's own name
        that runs it with an empty payload (:meth:`schedule` for the other options).
        ``unique`` (a :class:`leasework.Unique`) makes every door answer ``duplicate``, with
        the existing job's id, to a submit of the type whose key a job already holds.
        ``queue`` names the queue its jobs wait in (``default`` when left out; a submit may
        name another); the queue must exist (``leasework queues create NAME``).
        ``concurrency`` caps how many of its jobs run at once across all workers: per value
        of the payload field ``concurrency_key`` when given (one running job per customer:
        ``concurrency=1, concurrency_key="customer_id"``), else in all. A job over it waits,
        spending no attempt, while jobs of other keys run. ``rate`` (``"10/s"``, ``"100/m"``,
        ``"5/h"``) caps how many of its jobs start per second, minute or hour across all
        workers, per value of the payload field ``rate_key`` when given, with up to
        ``rate_burst`` at once after a quiet spell; a job over it waits for its reserved
        start, spending no attempt. ``priority``, from 0 (the highest, and the default) to 3,
        orders its jobs within their queue under backlog (a submit may ask another): a higher
        priority starts first, and a lower one waiting rises a level per second, so it is
        never starved. ``runs_in`` is the lane its handler runs in (:mod:`leasework.lanes`):
        ``"trio"`` (the default for an ``async def``), ``"thread"`` (the default for a plain
        ``def``), ``"asyncio"`` (an ``async def`` using asyncio libraries) or ``"process"``
        (a plain ``def`` doing CPU-bound work, in a child process)."""

        def decorate(handler: Callable[..., Any]) -> JobType:
            job_type = JobType(
                name or handler.__name__,
                handler,
                payload=payload,
                max_attempts=max_attempts,
                timeout=timeout,
                backoff=backoff,
                permanent=permanent,
                unique=unique,
                queue=queue,
                concurrency=concurrency,
                concurrency_key=concurrency_key,
                rate=rate,
                rate_burst=rate_burst,
                rate_key=rate_key,
                priority=priority,
                runs_in=runs_in,
            )
            self.add(job_type)
            if schedule is not None:
                self.schedule(job_type.name, schedule, job=job_type)
            return job_type

        return decorate

    def add(self, job_type: JobType) -> None:
        if job_type.name in self._types:
            raise AppError(f"job type {job_type.name!r} is defined twice in {self.name}")
        self._types[job_type.name] = job_type

    def include(self, other: App) -> App:
        """Add every job type and schedule of ``other``; a name defined in both is an
        error."""
        for job_type in other:
            self.add(job_type)
        for definition in other.schedules:
            self._add_schedule(definition)
        for lane, hooks in other.lane_hooks.items():
            for which, fns in hooks.items():
                self.lane_hooks.setdefault(lane, {}).setdefault(which, []).extend(fns)
        return self

    def on_lane_start(self, lane: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
        """Run the decorated function in ``lane`` as each worker opens it, before any job:
        an ``async def`` on the asyncio lane's own loop (an asyncpg pool, an aiohttp
        session) or in the trio lane, a plain ``def`` in a thread of the thread lane or in
        each new child of the process lane (``django.setup()``). A hook that fails stops the
        worker from starting. Like Celery's ``worker_process_init`` and arq's ``on_startup``."""
        return self._lane_hook(lane, "start")

    def on_lane_stop(self, lane: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
        """Run the decorated function in ``lane`` as the worker stops (in the process lane:
        as each child exits, retired or idle); a failure is logged."""
        return self._lane_hook(lane, "stop")

    def _lane_hook(self, lane: str, which: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
        def register(fn: Callable[[], Any]) -> Callable[[], Any]:
            name = f"{which} hook {getattr(fn, '__qualname__', fn)!r}"
            chosen = lane_of(name, fn, lane)
            self.lane_hooks.setdefault(chosen, {}).setdefault(which, []).append(fn)
            return fn

        return register

    def schedule(
        self,
        name: str,
        cron: str,
        *,
        job: str | JobType,
        payload: Any = None,
        timezone: str = "UTC",
        overlap: Overlap | str = Overlap.ALLOW,
        catch_up: CatchUp | str = CatchUp.LATEST,
        catch_up_limit: int = 1,
        grace: float | timedelta = DEFAULT_GRACE,
    ) -> Definition:
        """Declare a recurring schedule: a job of type ``job`` with ``payload`` at each tick
        of ``cron`` (five fields, or six with seconds first) in ``timezone``. Stored (and
        updated) when a process of the app starts; the relay's scheduler fires it. The
        payload is checked against the job type's now, if the app defines the type."""
        type_name = job.name if isinstance(job, JobType) else job
        payload = {} if payload is None else payload
        if (job_type := self.get(type_name)) is not None:
            if errors := job_type.payload_errors(payload):
                raise AppError(f"schedule {name!r}: payload is invalid for {type_name}: {errors}")
            payload = job_type.to_json(payload)
        try:
            definition = Definition(
                name=name,
                type=type_name,
                cron=cron,
                payload=payload,
                timezone=timezone,
                overlap=Overlap(overlap),
                catch_up=CatchUp(catch_up),
                catch_up_limit=catch_up_limit,
                grace_seconds=round(_seconds("grace", grace)),
            )
        except (ScheduleError, ValueError) as exc:
            raise AppError(str(exc)) from None
        self._add_schedule(definition)
        return definition

    def _add_schedule(self, definition: Definition) -> None:
        if definition.name in self._schedules:
            raise AppError(f"schedule {definition.name!r} is defined twice in {self.name}")
        self._schedules[definition.name] = definition

    @property
    def schedules(self) -> list[Definition]:
        """The schedules the app declares, by name."""
        return [self._schedules[n] for n in sorted(self._schedules)]

    def get(self, name: str) -> JobType | None:
        return self._types.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Iterator[JobType]:
        return iter(self._types.values())

    def __len__(self) -> int:
        return len(self._types)

    @property
    def names(self) -> list[str]:
        return sorted(self._types)

    def registry_rows(self) -> list[dict[str, Any]]:
        """The app's job types as rows of the ``job_types`` table (the SQL door reads it)."""
        return [
            {
                "name": t.name,
                "payload_schema": t.payload_schema(),
                "max_attempts": t.max_attempts,
                "timeout_seconds": t.timeout_seconds,
                "retry_base": t.backoff[0] if t.backoff else None,
                "retry_cap": t.backoff[1] if t.backoff else None,
                "description": t.description,
                "unique_policy": t.unique.spec() if t.unique is not None else None,
                "queue": t.queue,
                "concurrency": t.concurrency_spec(),
                "rate": t.rate.spec() if t.rate is not None else None,
                "priority": t.priority,
            }
            for t in self
        ]


def load_app(spec: str, variable: str = "LEASEWORK_APP") -> App:
    """Import ``module:attribute`` (``module`` alone means ``module:app``); several specs,
    comma-separated, are merged into one app. Raises :class:`AppLoadError` naming ``variable``
    and the cause."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise AppLoadError(
            f"{variable} is empty; name your app as module:attribute, e.g. mypkg.jobs:app "
            "(the demo app is leasework.demo:app)"
        )
    # like `python -m`, let the current directory's packages be found
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    merged = App(name=",".join(parts))
    for part in parts:
        module_name, _, attribute = part.partition(":")
        attribute = attribute or "app"
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # any import-time failure of the user's module
            raise AppLoadError(
                f"{variable}={spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        found = getattr(module, attribute, None)
        if not isinstance(found, App):
            what = "has no attribute" if found is None else f"has {type(found).__name__} at"
            raise AppLoadError(
                f"{variable}={spec!r}: module {module_name!r} {what} {attribute!r}; point it at "
                "a leasework.App, e.g. mypkg.jobs:app"
            )
        try:
            merged.include(found)
        except AppError as exc:
            raise AppLoadError(f"{variable}={spec!r}: {exc}") from None
    return merged
