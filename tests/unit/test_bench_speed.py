"""The bench's speed probe (:mod:`tools.bench.speed`): what it times, how a row's window reads
it, and the probe process itself."""

from __future__ import annotations

import time

from tools.bench import speed


def test_a_unit_costs_cpu_and_more_iterations_cost_more():
    small, large = speed.unit(10_000), speed.unit(200_000)
    assert 0 < small < large


def test_a_window_is_the_median_of_the_units_inside_it():
    samples = [(10.0, 30.0), (11.0, 14.0), (12.0, 16.0), (13.0, 30.0), (20.0, 99.0)]
    assert speed.summary(samples, 11.0, 13.0) == {
        "median": 16.0,  # not the mean (20): one slow unit does not move it
        "min": 14.0,
        "max": 30.0,
        "n": 3,
    }
    assert speed.summary(samples, 14.0, 19.0)["median"] is None  # no unit timed in it


def test_the_probe_lines_are_read_and_anything_else_is_not():
    assert speed.parse("1796630274.588 10.214\n") == (1796630274.588, 10.214)
    assert speed.parse("Traceback (most recent call last):") is None
    assert speed.parse("a b") is None
    assert speed.parse("") is None


def test_the_probe_process_times_units_until_it_is_stopped():
    probe = speed.SpeedProbe(interval=0.05)
    started = time.time()
    with probe:
        deadline = time.monotonic() + 20
        while len(probe.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    ended = time.time()
    assert len(probe.samples) >= 3
    window = probe.window(started, ended)
    assert window["n"] == len(probe.samples)
    assert all(ms > 0 for _, ms in probe.samples)
    assert probe._process is not None and probe._process.poll() is not None  # stopped
    count = len(probe.samples)
    time.sleep(0.2)
    assert len(probe.samples) == count  # nothing more once stopped
