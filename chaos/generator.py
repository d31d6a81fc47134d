"""The generators of a run, pure given a seed: the random fault mix
(:func:`random_schedule`) and the workload's submits (:func:`plan_submits`).

Nothing here does I/O or reads a clock: the same arguments always give the same schedule and
the same plan (a scenario's random faults are expanded when it is loaded). Each fault draws
its own target and params (:meth:`chaos.nemeses.base.Fault.random_target`,
``random_params``) from the one generator, in the order they always have.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from chaos import nemeses
from chaos.history import submit_value
from chaos.nemeses.base import PROCESSES, PROXIES
from chaos.scenario import LANE_LEDGERS, SHOP_KINDS, FaultSpec, RandomFaults, WorkloadSpec

# the shop's policy for send_receipt (examples/shop/jobs.py); its endpoint takes no options
RECEIPT_JOB_TYPE = "send_receipt"
RECEIPT_MAX_ATTEMPTS = 5
RECEIPT_TIMEOUT_SECONDS = 30

# ---------------------------------------------------------------- the random fault mix


def random_schedule(
    seed: int,
    duration: float,
    *,
    faults: Sequence[str] = nemeses.RANDOM_MIX,
    min_duration: float = 2.0,
    max_duration: float = 10.0,
    min_gap: float = 3.0,
    max_gap: float = 10.0,
    start: float = 5.0,
    tail: float = 10.0,
    processes: Sequence[str] = PROCESSES,
    proxies: Sequence[str] = PROXIES,
) -> tuple[FaultSpec, ...]:
    """A seeded fault schedule over a workload of ``duration`` seconds: one fault at a time,
    from ``start`` until ``tail`` seconds before the end, separated by quiet gaps. The same
    arguments always give the same schedule. Times are rounded to 0.1 s."""
    unknown = [f for f in faults if f not in nemeses.REGISTRY]
    if unknown or not faults:
        raise ValueError(
            f"faults must be a non-empty subset of {nemeses.FAULTS}, got {list(faults)}"
        )
    if not 0 < min_duration <= max_duration or not 0 <= min_gap <= max_gap:
        raise ValueError("need 0 < min_duration <= max_duration and 0 <= min_gap <= max_gap")
    rng = random.Random(seed)
    end = duration - tail
    schedule: list[FaultSpec] = []
    at = round(start, 1)
    while True:
        spec = draw_fault(rng, at, faults, min_duration, max_duration, processes, proxies)
        if spec.stop > end:
            break
        schedule.append(spec)
        at = round(at + spec.duration + rng.uniform(min_gap, max_gap), 1)
    return tuple(schedule)


def draw_fault(
    rng: random.Random,
    at: float,
    faults: Sequence[str],
    min_duration: float,
    max_duration: float,
    processes: Sequence[str] = PROCESSES,
    proxies: Sequence[str] = PROXIES,
) -> FaultSpec:
    """One fault of the random mix starting ``at``: the fault, its length (0 for a one-off),
    its target and its params, drawn from ``rng`` in that order."""
    fault = nemeses.lookup(rng.choice(list(faults)))
    length = round(rng.uniform(min_duration, max_duration), 1) if fault.lasts else 0.0
    target = fault.random_target(rng, processes, proxies)
    return FaultSpec(at, length, fault.name, target, fault.random_params(rng))


def random_faults(spec: RandomFaults, duration: float) -> tuple[FaultSpec, ...]:
    """A scenario's ``[random_faults]`` over a workload of ``duration`` seconds."""
    options = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return random_schedule(options.pop("seed"), duration, **options)


# ---------------------------------------------------------------- the workload's plan


@dataclass(frozen=True)
class PlannedSubmit:
    """One submit of the workload: when to send it (seconds after the start) and what."""

    at: float
    key: str
    kind: str  # one of MIX_KINDS
    job_type: str
    payload: dict[str, Any]  # the job's payload; for a shop kind, the order's body
    delay: float
    max_attempts: int
    timeout_seconds: int
    may_die: bool

    @property
    def via_shop(self) -> bool:
        """Sent to the example shop's ``POST /orders``, not to leasework's ``POST /jobs``."""
        return self.kind in SHOP_KINDS

    def value(self) -> dict[str, Any]:
        """The history value of its invocation."""
        return submit_value(
            self.key,
            self.job_type,
            self.payload,
            delay=self.delay,
            max_attempts=self.max_attempts,
            may_die=self.may_die,
        )


def plan_submits(workload: WorkloadSpec, *, seed: int, key_prefix: str) -> Iterator[PlannedSubmit]:
    """The workload's submits at a steady ``rate`` for ``duration`` seconds, kinds drawn by
    the mix's weights. Pure given the arguments; ``key_prefix`` makes the Idempotency-Keys
    unique to the run."""
    rng = random.Random(seed)
    kinds, weights = zip(*workload.mix.weights(), strict=True)
    count = int(workload.rate * workload.duration)
    for i in range(count):
        kind = rng.choices(kinds, weights)[0]
        delay, payload, job_type = 0.0, {}, "noop"
        max_attempts, may_die = workload.max_attempts, False
        timeout_seconds = workload.timeout_seconds
        if kind == "delayed":
            delay = round(rng.uniform(0.0, workload.delay_seconds), 3)
        elif kind == "fail":
            job_type, payload = "fail", {"times": workload.fail_times}
            max_attempts, may_die = workload.fail_max_attempts, workload.fail_may_die
        elif kind == "ledger" or kind in LANE_LEDGERS:
            job_type, payload = kind, {"seconds": workload.ledger_seconds}
        elif kind == "keyed":
            key = f"{key_prefix}-k{rng.randrange(workload.keys)}"
            job_type, payload = "keyed", {"key": key, "seconds": workload.ledger_seconds}
        elif kind == "rated":
            job_type, payload = "rated", {"key": f"{key_prefix}-r{rng.randrange(workload.keys)}"}
        elif kind == "receipt":
            # the order's body; the job's options are the shop's policy for send_receipt
            job_type = RECEIPT_JOB_TYPE
            amount = rng.randint(100, 99_999)
            payload = {"email": f"buyer-{i:06d}@shop.test", "amount_cents": amount}
            max_attempts, timeout_seconds = RECEIPT_MAX_ATTEMPTS, RECEIPT_TIMEOUT_SECONDS
        yield PlannedSubmit(
            at=round(i / workload.rate, 6),
            key=f"{key_prefix}-{i:06d}",
            kind=kind,
            job_type=job_type,
            payload=payload,
            delay=delay,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
            may_die=may_die,
        )
