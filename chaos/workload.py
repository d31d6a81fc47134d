"""The chaos workload: the client side of a run, in Jepsen's shape.

A :class:`WorkloadClient` sends the planned submits (:func:`chaos.generator.plan_submits`)
through the real HTTP API at their scheduled times from a bounded set of client processes, and
records every request and its outcome in the history. A submit of a shop kind (``receipt``) goes to
the example shop's ``POST /orders`` instead (the order and its ``send_receipt`` job in one
transaction, the planned key as the Idempotency-Key); its answer is classified the same way
and its job is the ``receipt_job_id`` of the answer.

- ``ok``: 2xx (the API's 202, the shop's 201, or 200 for a repeated key), the job id and
  status are in the completion's value (plus ``replay``: the server answered with a job an
  earlier request under the same key had already created);
- ``fail``: it certainly did not happen: a 4xx answer, a connection that could not even be
  opened (nothing was sent), or a 503 problem ``database-unavailable``, whose contract is
  "nothing was written" (the checker holds the API to that: a key only ever answered 503 that
  has a job is ``rejected_landed``, and :func:`client_view` flags a 503 followed by a replay);
- ``info``: unknown: the request may have been sent and the answer was lost (read timeout,
  reset connection, the harness's own deadline, any other 5xx).

Anything but a 4xx is retried with the same ``Idempotency-Key`` and the same body, as a new
invocation (after an ``info`` the client process takes a new id, as in Jepsen: the old one may
still be in flight), until it is acknowledged or ``retry_until`` passes.

:func:`client_view` and :func:`backlog_drain` are pure analyses of a finished run.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import trio

from chaos.generator import PlannedSubmit
from chaos.history import (
    SUBMIT,
    Op,
    OpOutcome,
    Recorder,
    fault_windows,
    pairs,
    submit_ok_value,
)
from leasework.client import submit_body
from leasework.states import Status
from leasework.tokens import auth_headers, default_token

# 5xx problem types whose contract says nothing was written
NOTHING_WRITTEN_PROBLEMS = frozenset({"database-unavailable"})
# transport errors raised before a single byte of the request could have left
NOT_SENT_ERRORS: tuple[type[BaseException], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)


@dataclass(frozen=True)
class Classified:
    """How one HTTP attempt ended: its history completion type, whether to retry, and why."""

    type: OpOutcome
    retry: bool
    reason: str  # short and stable, for counting: "202", "http-422", "ReadTimeout", ...
    error: str | None = None  # the completion's error text


def _problem_type(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    kind = body.get("type", "") if isinstance(body, dict) else ""
    return str(kind).rsplit("/", 1)[-1]


def classify_response(response: httpx.Response) -> Classified:
    """The outcome of an attempt that got an HTTP answer."""
    code = response.status_code
    if 200 <= code < 300:
        return Classified("ok", False, str(code))
    detail = response.text[:300].replace("\n", " ")
    if 400 <= code < 500 and code not in (408, 429):
        # the request was refused as it is: retrying the same body cannot help
        return Classified("fail", False, f"http-{code}", f"HTTP {code}: {detail}")
    if code in (408, 429):
        return Classified("fail", True, f"http-{code}", f"HTTP {code}: {detail}")
    if _problem_type(response) in NOTHING_WRITTEN_PROBLEMS:
        return Classified("fail", True, f"http-{code}-nothing-written", f"HTTP {code}: {detail}")
    return Classified("info", True, f"http-{code}", f"HTTP {code}: {detail}")


def classify_exception(exc: BaseException) -> Classified:
    """The outcome of an attempt that raised instead of answering."""
    name = type(exc).__name__
    text = f"{name}: {exc}"[:300]
    if isinstance(exc, NOT_SENT_ERRORS):
        return Classified("fail", True, name, text)
    return Classified("info", True, name, text)


JOBS_PATH = "/jobs"  # leasework's API
ORDERS_PATH = "/orders"  # the example shop's


def request_body(planned: PlannedSubmit) -> dict[str, Any]:
    """The JSON body of a planned submit; every retry sends exactly this (same request hash).
    For a shop kind it is the order (``{"email", "amount_cents"}``)."""
    if planned.via_shop:
        return dict(planned.payload)
    return submit_body(
        planned.job_type,
        planned.payload,
        delay_seconds=planned.delay if planned.delay > 0 else None,
        max_attempts=planned.max_attempts,
        timeout_seconds=planned.timeout_seconds,
    )


def acknowledged_job(planned: PlannedSubmit, answer: Mapping[str, Any]) -> tuple[str, str] | None:
    """The job id and status a 2xx answer names, or None when it names no job. The shop
    answers with its order; its receipt job was just created queued (or already existed)."""
    if planned.via_shop:
        job_id = answer.get("receipt_job_id")
        status: Any = Status.QUEUED.value
    else:
        job_id, status = answer.get("id"), answer.get("status")
    if job_id is None or str(job_id) in ("", "None"):
        return None
    return str(job_id), str(status)


def retry_backoff(attempt: int, *, base: float = 0.25, cap: float = 2.0) -> float:
    """Seconds before retry number ``attempt`` (1-based): full jitter, capped."""
    return random.uniform(0.0, min(cap, base * 2 ** min(attempt - 1, 16)))


@dataclass
class WorkloadStats:
    """What the client did, counted while it ran."""

    planned: int = 0
    keys_invoked: int = 0
    attempts: int = 0
    by_outcome: Counter[str] = field(default_factory=Counter)  # ok / fail / info
    by_reason: Counter[str] = field(default_factory=Counter)  # "info ReadTimeout", ...
    acknowledged: int = 0  # keys that got a 202
    given_up: int = 0  # keys still unresolved when retry_until passed
    rejected: int = 0  # keys refused with a final 4xx
    late_start: float = 0.0  # worst lag of a submit behind its schedule (client backpressure)

    def to_dict(self) -> dict[str, Any]:
        return {
            "planned": self.planned,
            "keys_invoked": self.keys_invoked,
            "attempts": self.attempts,
            "by_outcome": dict(sorted(self.by_outcome.items())),
            "by_reason": dict(sorted(self.by_reason.items())),
            "acknowledged": self.acknowledged,
            "given_up": self.given_up,
            "rejected": self.rejected,
            "late_start": round(self.late_start, 3),
        }


class WorkloadClient:
    """Sends ``plan`` through the API at ``base_url`` (a shop kind's submits to the example
    shop at ``shop_url``), recording into ``recorder``.

    ``clients`` processes submit concurrently; each submits one key at a time (retrying it
    until it is resolved), so a stalled API slows the client down instead of piling up
    requests. Times in the plan and ``retry_until`` are seconds on the recorder's clock.
    """

    def __init__(
        self,
        recorder: Recorder,
        plan: Sequence[PlannedSubmit],
        *,
        base_url: str,
        shop_url: str | None = None,
        clients: int = 4,
        submit_timeout: float = 5.0,
        retry_until: float = math.inf,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.recorder = recorder
        self.plan = list(plan)
        self.base_url = base_url
        self.shop_url = shop_url
        self.clients = max(1, clients)
        self.submit_timeout = submit_timeout
        self.retry_until = retry_until
        self.transport = transport
        self.stats = WorkloadStats(planned=len(self.plan))
        if self.shop_url is None and any(p.via_shop for p in self.plan):
            raise ValueError("the plan places orders through the shop: give a shop_url")

    def url(self, planned: PlannedSubmit) -> str:
        """Where a planned submit is sent (absolute URLs bypass the client's base_url)."""
        if planned.via_shop:
            return f"{str(self.shop_url).rstrip('/')}{ORDERS_PATH}"
        return f"{self.base_url.rstrip('/')}{JOBS_PATH}"

    def _deadline(self, relative: float) -> float:
        """A trio deadline for a time on the recorder's clock."""
        return trio.current_time() + (relative - self.recorder.now())

    async def run(self) -> WorkloadStats:
        limits = httpx.Limits(
            max_connections=self.clients * 2, max_keepalive_connections=self.clients
        )
        timeout = httpx.Timeout(self.submit_timeout)
        async with httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout,
            limits=limits,
            transport=self.transport,
            headers=auth_headers(default_token()),
        ) as http:
            send, receive = trio.open_memory_channel[PlannedSubmit](math.inf)
            async with trio.open_nursery() as nursery:
                for number in range(self.clients):
                    nursery.start_soon(self._client, number, http, receive.clone())
                receive.close()
                async with send:
                    for planned in self.plan:
                        await trio.sleep_until(self._deadline(planned.at))
                        send.send_nowait(planned)
        return self.stats

    async def _client(
        self,
        number: int,
        http: httpx.AsyncClient,
        receive: trio.MemoryReceiveChannel[PlannedSubmit],
    ) -> None:
        process = number
        async with receive:
            async for planned in receive:
                self.stats.late_start = max(self.stats.late_start, self.recorder.now() - planned.at)
                process = await self.submit(http, process, planned)

    async def submit(self, http: httpx.AsyncClient, process: int, planned: PlannedSubmit) -> int:
        """Submit one key until it is resolved; returns the client's process id afterwards."""
        self.stats.keys_invoked += 1
        url, body = self.url(planned), request_body(planned)
        headers = {"Idempotency-Key": planned.key}
        value = planned.value()
        attempt = 0
        while True:
            attempt += 1
            self.stats.attempts += 1
            invocation = self.recorder.invoke(process, SUBMIT, value)
            result, answer = await self._attempt(http, planned, url, body, headers)
            self.stats.by_outcome[result.type] += 1
            self.stats.by_reason[f"{result.type} {result.reason}"] += 1
            # an answer comes only with an ok that names its job
            acked = acknowledged_job(planned, answer) if answer is not None else None
            if answer is not None and acked is not None:
                ok_value = submit_ok_value(value, *acked)
                ok_value["replay"] = bool(answer.get("replay", False))
                ok_value["attempt"] = attempt
                if "order_id" in answer:
                    ok_value["order_id"] = answer["order_id"]
                self.recorder.complete(invocation, "ok", ok_value)
                self.stats.acknowledged += 1
                return process
            self.recorder.complete(invocation, result.type, error=result.error)
            if result.type == "info":
                process += self.clients  # the old process may still be in flight
            if not result.retry:
                self.stats.rejected += 1
                return process
            pause = retry_backoff(attempt)
            if self.recorder.now() + pause > self.retry_until:
                self.stats.given_up += 1
                return process
            await trio.sleep(pause)

    async def _attempt(
        self,
        http: httpx.AsyncClient,
        planned: PlannedSubmit,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
    ) -> tuple[Classified, dict[str, Any] | None]:
        """One request; the answer's JSON object along with a 2xx."""
        # httpx's own timeouts bound each phase; the cancel scope bounds the whole attempt
        with trio.move_on_after(self.submit_timeout + 1.0):
            try:
                response = await http.post(url, json=body, headers=headers)
            except httpx.HTTPError as exc:
                return classify_exception(exc), None
            result = classify_response(response)
            if result.type != "ok":
                return result, None
            answer = _json(response)
            if acknowledged_job(planned, answer) is None:
                code = response.status_code
                return Classified("info", True, "no-job-id", f"{code} without a job id"), None
            return result, answer
        return (
            Classified("info", True, "harness-deadline", "no answer within the harness deadline"),
            None,
        )


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------- analysis of a finished run


@dataclass(frozen=True)
class ClientView:
    """The submits as the client saw them, joined with the jobs table.

    ``unknown_keys``: keys with at least one ``info`` attempt. Of those, ``unknown_landed``
    were found in the table (``unknown_replayed``: proven by the API answering a later retry
    with ``replay`` true, i.e. the unknown attempt itself had created the job), and
    ``unknown_not_landed`` were not. ``failed_then_replayed``: keys whose only earlier
    attempts were answered "nothing was written" (503) yet whose acknowledgement was a
    replay: the 503 was wrong, something had been written."""

    keys: int
    unknown_keys: int
    unknown_landed: int
    unknown_replayed: int
    unknown_not_landed: int
    retried_keys: int
    jobs_per_key_max: int
    failed_then_replayed: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), failed_then_replayed=list(self.failed_then_replayed))


def client_view(history: Sequence[Op], jobs: Iterable[Mapping[str, Any]]) -> ClientView:
    keyed: dict[str, int] = Counter(
        str(j["idempotency_key"]) for j in jobs if j.get("idempotency_key") is not None
    )
    by_key: dict[str, list[tuple[str, dict[str, Any], str | None]]] = {}
    for pair in pairs([op for op in history if op.f == SUBMIT]):
        key = pair.invoke.value.get("key")
        if not isinstance(key, str):
            continue
        completion = pair.completion
        value = completion.value if completion is not None else pair.invoke.value
        error = completion.error if completion is not None else None
        by_key.setdefault(key, []).append((pair.type, value, error))
    unknown = landed = replayed = not_landed = retried = 0
    contradictions: list[str] = []
    for key, attempts in by_key.items():
        kinds = [kind for kind, _, _ in attempts]
        if len(attempts) > 1:
            retried += 1
        first_ok = next((i for i, k in enumerate(kinds) if k == "ok"), None)
        if "info" in kinds:
            unknown += 1
            if keyed.get(key):
                landed += 1
                if first_ok is not None and attempts[first_ok][1].get("replay"):
                    earlier = kinds[:first_ok]
                    if "info" in earlier:
                        replayed += 1
            else:
                not_landed += 1
        if first_ok is not None and first_ok > 0 and attempts[first_ok][1].get("replay"):
            earlier = attempts[:first_ok]
            # connection failures sent nothing: only a 503 attempt can have written the job
            if all(kind == "fail" for kind, _, _ in earlier) and any(
                (error or "").startswith("HTTP 503") for _, _, error in earlier
            ):
                contradictions.append(key)
    return ClientView(
        keys=len(by_key),
        unknown_keys=unknown,
        unknown_landed=landed,
        unknown_replayed=replayed,
        unknown_not_landed=not_landed,
        retried_keys=retried,
        jobs_per_key_max=max(keyed.values(), default=0),
        failed_then_replayed=tuple(contradictions),
    )


@dataclass(frozen=True)
class Drain:
    """After one fault was healed: how long until every job that existed and was due by then
    had finished (None: some never did)."""

    fault: str
    target: str | None
    stopped: float
    jobs: int  # jobs due by the heal
    seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def backlog_drain(
    history: Sequence[Op], jobs: Iterable[Mapping[str, Any]], run_started_at: datetime
) -> list[Drain]:
    """For each healed fault window: seconds from the heal until the last job created before
    it, and due before it (created_at + its submit's delay), reached a terminal state.

    A stricter recovery measure than the checker's (the first job finished after the heal):
    this one says when the backlog the fault built up was gone.
    """
    delays: dict[str, float] = {}
    for op in history:
        if op.f == SUBMIT and op.is_invoke and isinstance(op.value.get("key"), str):
            delays.setdefault(op.value["key"], float(op.value.get("delay") or 0.0))
    rows = []
    for job in jobs:
        created, finished = _ts(job.get("created_at")), _ts(job.get("finished_at"))
        if created is None:
            continue
        due = created + timedelta(seconds=delays.get(str(job.get("idempotency_key")), 0.0))
        due_s = (due - run_started_at).total_seconds()
        done_s = None if finished is None else (finished - run_started_at).total_seconds()
        rows.append((due_s, done_s))
    result = []
    for window in fault_windows(history):
        if window.stop is None:
            continue
        backlog = [done for due, done in rows if due <= window.stop]
        seconds: float | None
        if any(done is None for done in backlog):
            seconds = None
        else:
            last = max((done for done in backlog if done is not None), default=window.stop)
            seconds = round(max(0.0, last - window.stop), 3)
        result.append(Drain(window.fault, window.target, window.stop, len(backlog), seconds))
    return result


def _ts(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value
