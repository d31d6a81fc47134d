"""The history file: exact round trips, the line format, torn and bad lines."""

from __future__ import annotations

import pytest

from chaos.history import (
    HistoryError,
    HistoryWriter,
    Op,
    Recorder,
    nemesis_value,
    read_history,
    submit_ok_value,
    submit_value,
)


def test_history_round_trips_exactly(tmp_path):
    ticks = iter([100.0, 100.1, 100.30000000000001, 101.7, 102.0, 103.25])
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        rec = Recorder(writer, clock=lambda: next(ticks))
        value = submit_value("k-1", "ledger", {"seconds": 0.1 + 0.2, "ü": [1, None, True]})
        inv = rec.invoke(3, "submit", value)
        rec.complete(inv, "ok", submit_ok_value(value, "5f2c", "queued"))
        start = rec.invoke("nemesis", "nemesis", nemesis_value("latency", "start", "postgres"))
        rec.complete(start, "info")
        inv2 = rec.invoke(4, "submit", submit_value("k-2", "noop", {}))
        # each line is on disk before the next operation
        assert len(path.read_text().splitlines()) == 5
    ops = read_history(path)
    assert ops == rec.ops
    assert [op.index for op in ops] == list(range(5))
    # the first clock reading (at construction) is time zero
    assert ops[0].time == pytest.approx(0.1) and ops[2].time == pytest.approx(1.7)
    assert ops[1].value["payload"]["seconds"] == 0.1 + 0.2
    assert inv2 == ops[4]


def test_history_line_format(tmp_path):
    op = Op(7, 1.5, 2, "info", "submit", submit_value("k", "noop", {}), "timeout")
    assert op.to_json() == (
        '{"index":7,"time":1.5,"process":2,"type":"info","f":"submit",'
        '"value":{"key":"k","type":"noop","payload":{},"delay":0.0,"may_die":false},'
        '"error":"timeout"}'
    )
    assert Op.from_json(op.to_json()) == op


def test_a_torn_last_line_is_dropped_but_a_bad_middle_line_is_named(tmp_path):
    good = Op(0, 0.0, 0, "invoke", "submit", submit_value("k", "noop", {})).to_json()
    torn = tmp_path / "torn.jsonl"
    torn.write_text(good + "\n" + good[:20])
    assert len(read_history(torn)) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n{not json\n" + good + "\n")
    with pytest.raises(HistoryError, match=r"bad\.jsonl:2"):
        read_history(bad)
    with pytest.raises(HistoryError, match="type"):
        Op(0, 0.0, 0, "done", "submit", {})  # type: ignore[arg-type]
