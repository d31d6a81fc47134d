"""Request bodies (pure): a body that could hold more values than its door allows is refused
before it is decoded, and a large body is decoded off the event loop, with the cycle
collector held off meanwhile and given back after."""

from __future__ import annotations

import gc
import threading

import pytest

from leasework.api.bodies import off_loop, parse_body
from leasework.api.limits import OFFLOAD_BYTES
from leasework.api.problems import Problem


def test_a_body_that_could_hold_too_many_values_is_refused_before_it_is_decoded():
    # not even JSON: a decoder would say "malformed"; the estimate refuses it first
    raw = b"[" + b"0," * 2000
    with pytest.raises(Problem) as refused:
        parse_body("application/json", raw, 1_000_000, max_values=1000)
    assert refused.value.status == 413 and refused.value.slug == "body-too-complex"
    with pytest.raises(Problem) as malformed:
        parse_body("application/json", raw, 1_000_000)
    assert malformed.value.status == 400


async def test_a_large_body_is_decoded_in_a_worker_thread_and_a_small_one_on_the_loop():
    loop = threading.get_ident()
    assert await off_loop(OFFLOAD_BYTES, threading.get_ident) == loop
    assert await off_loop(OFFLOAD_BYTES + 1, threading.get_ident) != loop


async def test_the_cycle_collector_is_held_off_in_the_thread_and_given_back_after_a_refusal():
    seen = []

    def refuse() -> None:
        seen.append(gc.isenabled())
        raise Problem(422, "x", "X", "refused")

    with pytest.raises(Problem) as refused:
        await off_loop(OFFLOAD_BYTES + 1, refuse)
    assert seen == [False] and gc.isenabled()
    assert refused.value.__context__ is None
