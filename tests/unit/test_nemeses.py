"""The fault registry: every fault of chaos/nemeses is complete (its start and heal, its
targets, its params and their random draw, its colour), the vocabulary keeps its order (the
seeded random mix of existing scenarios depends on it), and what a fault draws for the random
mix is what its scenario file would accept."""

from __future__ import annotations

import random
import re

import pytest

from chaos import nemeses
from chaos.loader import loads_scenario
from chaos.nemeses.base import PROCESSES, PROXIES, Fault

# the order of the vocabulary before the registry: scenario j's schedule is drawn from it
HISTORICAL_ORDER = (
    "latency",
    "timeout",
    "reset_peer",
    "bandwidth",
    "slicer",
    "limit_data",
    "link_down",
    "sigstop",
    "sigkill",
    "restart",
    "kafka_kill",
    "redis_restart",
    "redis_flushall",
)


def test_the_vocabulary_is_the_registry_in_its_families_order():
    # the random mix draws from the historical vocabulary; later faults come after it
    assert nemeses.RANDOM_MIX == HISTORICAL_ORDER
    added = ("postgres_restart", "queue_pause")
    records = ("records_delete", "topic_recreate", "offsets_reset", "retention_shrink")
    assert nemeses.FAULTS == (*HISTORICAL_ORDER, *added, *records)
    families = [nemeses.lookup(name).family for name in nemeses.FAULTS]
    order = ["toxic", "process", "kafka", "redis", "postgres", "queue", "records"]
    assert families == sorted(families, key=order.index)
    with pytest.raises(ValueError, match="unknown fault 'meteor'; known: latency, "):
        nemeses.lookup("meteor")


@pytest.mark.parametrize("name", nemeses.FAULTS)
def test_every_fault_is_complete(name):
    fault = nemeses.lookup(name)
    assert fault.name == name and fault.family
    assert re.fullmatch(r"#[0-9a-f]{6}", fault.colour) and fault.colour != Fault.colour
    assert type(fault).start is not Fault.start and type(fault).heal is not Fault.heal
    assert type(fault).target_problem is not Fault.target_problem
    assert fault.affected(fault.random_target(random.Random(0), PROCESSES, PROXIES))
    # a one-off (nothing to heal) is also an instant: a duration of 0
    assert fault.lasts or fault.instant


@pytest.mark.parametrize("name", nemeses.FAULTS)
@pytest.mark.parametrize("seed", range(5))
def test_what_the_random_mix_draws_a_scenario_file_accepts(name, seed):
    fault = nemeses.lookup(name)
    rng = random.Random(seed)
    target = fault.random_target(rng, PROCESSES, PROXIES)
    params = fault.random_params(rng)
    assert fault.target_problem(target) is None
    inline = ", ".join(f"{k} = {v!r}" for k, v in params.items())
    text = (
        'name = "x"\n[workload]\nrate = 1\nduration = 10\n'
        f'[[faults]]\nat = 1\nduration = 2\nfault = "{name}"\ntarget = "{target}"\n'
        + (f"params = {{ {inline} }}\n" if params else "")
    )
    (loaded,) = loads_scenario(text).faults
    assert (loaded.fault, loaded.target, loaded.params) == (name, target, params)
