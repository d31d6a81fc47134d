"""The execute stage's decision of what an attempt came to (pure functions, no servers)."""

from __future__ import annotations

import dataclasses

import pytest

from leasework.job import Job
from leasework.outcomes import RetryDefaults, retry_outcome
from leasework.states import Status
from leasework.worker.execution import HandlerResult
from leasework.worker.heartbeat import CancelReason
from leasework.worker.outcome import effect_failure, outcome_of
from tests.unit.test_worker_timing import make_job

TINY = RetryDefaults(base=1e-6, cap=1e-6)  # a retry within a microsecond
HUGE = RetryDefaults(base=1e6, cap=1e6)  # a retry within a million seconds


def job(**fields) -> Job:
    """Attempt 1 of 3, a 3600 s timeout, no backoff of its own, unless ``fields`` say."""
    return dataclasses.replace(make_job("noop", {}), **fields)


def test_a_handler_that_returned_succeeds_with_its_result():
    outcome = outcome_of(
        job(), HandlerResult(result={"n": 1}), TINY, timed_out=False, cancelled_by=None
    )
    assert outcome.status == Status.SUCCEEDED
    assert outcome.result == {"n": 1} and outcome.error is None and outcome.retry_in is None


def test_a_cancel_request_is_cancelled_even_if_the_handler_returned():
    ok = HandlerResult(result=1)
    outcome = outcome_of(job(), ok, TINY, timed_out=False, cancelled_by=CancelReason.REQUEST)
    assert outcome.status == Status.CANCELLED
    assert outcome.error == "cancelled on request while running"


@pytest.mark.parametrize(
    ("reason", "timed_out", "error"),
    [
        (CancelReason.LEASE, False, "lease lost: handler cancelled at its lease deadline"),
        (None, True, "timed out after 3600s"),
        (None, False, "timed out after 3600s"),  # no result and no reason: a scope cut it
    ],
)
def test_a_scope_that_cut_the_handler_short_retries_with_backoff(reason, timed_out, error):
    outcome = outcome_of(job(), None, TINY, timed_out=timed_out, cancelled_by=reason)
    assert outcome.status == Status.FAILED and outcome.error == error
    assert 0.0 <= outcome.retry_in <= 1e-6


def test_a_shutdown_retries_at_once_whatever_the_backoff():
    outcome = outcome_of(job(), None, HUGE, timed_out=False, cancelled_by=CancelReason.SHUTDOWN)
    assert outcome.status == Status.FAILED and outcome.retry_in == 0.0
    assert outcome.error == "worker shut down before the handler finished"


def test_the_last_attempt_is_dead_whatever_cut_it_short():
    last = job(attempt=3, max_attempts=3)
    for reason in (CancelReason.LEASE, CancelReason.SHUTDOWN, None):
        outcome = outcome_of(last, None, TINY, timed_out=reason is None, cancelled_by=reason)
        assert outcome.status == Status.DEAD and outcome.retry_in is None, reason


def test_a_handler_error_is_dead_only_when_permanent():
    failed = HandlerResult(error="ValueError: no", permanent=False)
    poison = HandlerResult(error="payload does not fit", permanent=True)
    retried = outcome_of(job(), failed, TINY, timed_out=False, cancelled_by=None)
    dead = outcome_of(job(), poison, TINY, timed_out=False, cancelled_by=None)
    assert (retried.status, retried.error) == (Status.FAILED, "ValueError: no")
    assert (dead.status, dead.error) == (Status.DEAD, "payload does not fit")


def test_the_jobs_own_backoff_wins_over_the_defaults():
    own = retry_outcome(job(retry_base=1e-6, retry_cap=1e-6), "e", HUGE)
    assert own.status == Status.FAILED and own.retry_in <= 1e-6
    defaults = retry_outcome(job(), "e", TINY)
    assert defaults.retry_in <= 1e-6
    assert retry_outcome(job(), "e", HUGE, permanent=True).status == Status.DEAD


def test_an_effect_that_raised_fails_the_attempt_or_kills_it_when_permanent():
    retried = effect_failure(job(), ValueError("boom"), TINY, permanent=False)
    assert retried.status == Status.FAILED
    assert retried.error == "a fenced effect raised ValueError: boom"
    assert effect_failure(job(), KeyError("k"), TINY, permanent=True).status == Status.DEAD


def test_an_attempt_a_service_refused_is_a_lost_lease_retried_not_a_handler_error():
    """A StaleFence from a downstream service (leasework.downstream; never permanent, see
    test_execution.py): its outcome is written only if the attempt still holds the job,
    which then is retried."""
    stale = HandlerResult(error="StaleFence: refused", stale=True)
    outcome = outcome_of(job(), stale, TINY, timed_out=False, cancelled_by=None)
    assert outcome.status == Status.FAILED and outcome.retry_in is not None
    assert (
        outcome.error == "lease lost: a service refused the attempt's fence (StaleFence: refused)"
    )
