import random

import pytest

from leasework.backoff import retry_delay


def test_full_jitter_stays_within_the_exponential_ceiling():
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(60.0, 0.5 * 2 ** (attempt - 1))
        delays = [retry_delay(attempt, 0.5, 60.0, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        # full jitter: spread over the whole range, not bunched at the top
        assert min(delays) < ceiling * 0.2 and max(delays) > ceiling * 0.8


def test_cap_bounds_huge_attempt_numbers():
    assert retry_delay(10_000, 1.0, 30.0, random.Random(1)) <= 30.0


def test_attempts_are_one_based():
    with pytest.raises(ValueError):
        retry_delay(0, 1.0, 10.0)


def test_retry_or_dead_is_one_decision_for_worker_and_reaper():
    from leasework.backoff import retry_or_dead
    from leasework.states import Status

    rng = random.Random(1)
    assert retry_or_dead(5, 5, 1.0, 10.0).status == Status.DEAD
    assert retry_or_dead(1, 5, 1.0, 10.0, permanent=True).status == Status.DEAD
    retry = retry_or_dead(2, 5, 1.0, 10.0, rng=rng)
    assert retry.status == Status.FAILED and 0.0 <= retry.delay <= 2.0
    assert retry_or_dead(2, 5, 1.0, 10.0, immediate=True).delay == 0.0
