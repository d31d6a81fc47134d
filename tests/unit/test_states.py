import pytest
from hypothesis import given
from hypothesis import strategies as st

from leasework.states import (
    TERMINAL,
    TRANSITIONS,
    WAITING,
    IllegalTransition,
    Status,
    sources_of,
    transition,
)


def test_terminal_states_have_no_way_out():
    assert TERMINAL == {Status.SUCCEEDED, Status.DEAD, Status.CANCELLED}
    for status in TERMINAL:
        for target in Status:
            with pytest.raises(IllegalTransition):
                transition(status, target)


def test_every_waiting_state_can_be_cancelled_and_running_only_cooperatively():
    for status in WAITING | {Status.RUNNING}:
        assert transition(status, Status.CANCELLED) == Status.CANCELLED


def test_queued_is_reached_only_from_the_promoters_sources():
    assert set(sources_of(Status.QUEUED)) == {Status.SCHEDULED, Status.FAILED}


def test_illegal_transition_message_names_the_allowed_moves():
    with pytest.raises(IllegalTransition, match="scheduled may go to cancelled, queued"):
        transition("scheduled", "running")


@given(st.lists(st.sampled_from(list(Status)), max_size=40))
def test_random_walks_follow_the_table(targets):
    """Drive random sequences: every step either follows the table or raises, and a job
    never leaves a terminal state."""
    current = Status.QUEUED
    path = [current]
    for target in targets:
        if target in TRANSITIONS[current]:
            current = transition(current, target)
            path.append(current)
        else:
            with pytest.raises(IllegalTransition):
                transition(current, target)
    for before, after in zip(path, path[1:], strict=False):
        assert before not in TERMINAL
        assert after in TRANSITIONS[before]
    # running is always entered from queued: no job runs without being claimed from the queue
    for before, after in zip(path, path[1:], strict=False):
        if after == Status.RUNNING:
            assert before == Status.QUEUED


def test_only_an_operators_retry_brings_back_a_dead_or_cancelled_job():
    for status in (Status.DEAD, Status.CANCELLED):
        with pytest.raises(IllegalTransition):
            transition(status, Status.QUEUED)
        assert transition(status, Status.QUEUED, requeue=True) == Status.QUEUED
    with pytest.raises(IllegalTransition):
        transition(Status.SUCCEEDED, Status.QUEUED, requeue=True)
    # the promoter asks what can become queued: never a finished job
    assert not set(sources_of(Status.QUEUED)) & TERMINAL


def test_a_queued_job_of_a_type_unknown_to_its_worker_can_be_deferred():
    assert transition(Status.QUEUED, Status.SCHEDULED) == Status.SCHEDULED
