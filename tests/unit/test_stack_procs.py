"""Pidfiles, /proc identity checks and small helpers of devstack (no servers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from devstack import Stack
from devstack.cli import _signal
from devstack.errors import StackError, tail
from devstack.layout import Layout
from devstack.procs import (
    cmdline_matches,
    is_alive,
    read_environ,
    read_pidfile,
    read_proc,
    remove_pidfile,
    session_members,
    spawn,
    terminate,
    write_pidfile,
)
from devstack.status import ServiceStatus, format_table


def test_pidfile_roundtrip(tmp_path: Path) -> None:
    pf = tmp_path / "pids" / "x.pid"
    assert read_pidfile(pf) is None
    write_pidfile(pf, 1234)
    assert pf.read_text() == "1234\n"
    assert read_pidfile(pf) == 1234
    pf.write_text("garbage\n")
    assert read_pidfile(pf) is None
    pf.write_text("")
    assert read_pidfile(pf) is None
    remove_pidfile(pf)
    remove_pidfile(pf)  # idempotent
    assert not pf.exists()


def test_cmdline_matches() -> None:
    redis = ("/usr/bin/redis-server 127.0.0.1:16380",)  # rewritten process title
    assert cmdline_matches(redis, ("redis-server", ":16380"))
    assert not cmdline_matches(redis, ("redis-server", ":6379 "))
    java = ("/usr/bin/java", "-cp", "/c/libs/*", "kafka.Kafka", "/s/kafka-2/server.properties")
    assert cmdline_matches(java, ("kafka.Kafka", "/s/kafka-2/server.properties"))
    assert not cmdline_matches(java, ("kafka.Kafka", "/s/kafka-1/server.properties"))
    assert not cmdline_matches((), ("anything",))  # zombies / kernel threads


def test_read_proc_parses_odd_comm(tmp_path: Path) -> None:
    d = tmp_path / "4242"
    d.mkdir()
    # comm may contain spaces and parentheses; fields after the last ')' are positional
    (d / "stat").write_text("4242 (we ird) (name) S 1 4242 4241 0 -1 4194560 0 0\n")
    (d / "cmdline").write_bytes(b"/bin/we ird\0--flag\0")
    info = read_proc(4242, tmp_path)
    assert info is not None
    assert (info.state, info.pgrp, info.session) == ("S", 4242, 4241)
    assert info.cmdline == ("/bin/we ird", "--flag")
    assert info.alive
    (d / "stat").write_text("4242 (x) Z 1 4242 4242 0 -1 0\n")
    assert not read_proc(4242, tmp_path).alive  # type: ignore[union-attr]
    assert read_proc(999999, tmp_path) is None


def test_own_process_is_visible() -> None:
    info = read_proc(os.getpid())
    assert info is not None and info.alive
    env = read_environ(os.getpid())
    assert env is not None and env.get("PATH") == os.environ.get("PATH")


def test_spawn_new_session_and_terminate(tmp_path: Path) -> None:
    log = tmp_path / "sleeper.log"
    script = (
        "import subprocess, time; subprocess.Popen(['sleep', '60']);"
        "print('up', flush=True); time.sleep(60)"
    )
    pid = spawn([sys.executable, "-c", script], log)
    try:
        info = read_proc(pid)
        assert info is not None and info.session == pid and info.pgrp == pid
        deadline = time.monotonic() + 10
        while len(session_members(pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = session_members(pid)
        assert len(members) == 2  # python + its sleep child
    finally:
        terminate([(pid, 15)], timeout=5)
    assert not is_alive(pid)
    assert session_members(pid) == []  # the sleep child was killed as a leftover
    text = log.read_text()
    assert "=== devstack" in text and "up" in text


def test_zombie_counts_as_dead() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        info = read_proc(child.pid)
        if info is not None and not info.alive:
            break
        time.sleep(0.02)
    assert not read_proc(child.pid).alive  # type: ignore[union-attr]  # not reaped yet
    child.wait()


def test_stack_does_not_trust_a_recycled_pid(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "state", tmp_path / "cache", tmp_path)
    stack = Stack(layout)
    # a live pid that is not kafka-1 (this pytest process)
    write_pidfile(layout.pidfile("kafka-1"), os.getpid())
    assert stack.pid("kafka-1") is None
    assert not stack.is_running("kafka-1")
    write_pidfile(layout.pidfile("redis"), 2**22 + 12345)  # beyond pid_max: gone
    assert stack.pid("redis") is None
    rows = {r.name: r for r in stack.status()}
    # (the note may instead say FOREIGN when a real stack runs on this machine)
    assert not rows["kafka-1"].alive and rows["kafka-1"].pid == os.getpid()
    assert not rows["redis"].alive and not rows["redis"].ready
    try:
        stack.service("nope")
    except StackError as e:
        assert "kafka-1" in str(e)
    else:
        raise AssertionError("unknown service accepted")


def test_names_and_addresses(tmp_path: Path) -> None:
    stack = Stack(Layout(tmp_path, tmp_path, tmp_path))
    assert stack.names() == [
        "postgres", "redis", "toxiproxy", "kafka-1", "kafka-2", "kafka-3", "alertmanager",
        "prometheus", "api", "relay", "worker-1", "worker-2", "shop", "relay-2", "relay-3",
    ]  # fmt: skip
    assert stack.names("app") == ["api", "relay", "worker-1", "worker-2"]
    assert stack.address("api") == "127.0.0.1:8080"
    assert "127.0.0.1:15432" in stack.address("postgres")


def test_extra_relays_are_the_chaos_harness_s_alone(tmp_path: Path) -> None:
    """relay-2 and relay-3 are leasework relays with ops ports and names of their own, of
    kind "extra": `up` (names("app")) never starts them, `down` stops them, and `status`
    lists one only once something started it."""
    from devstack.stack import STOP_TIERS

    layout = Layout(tmp_path, tmp_path, tmp_path)
    stack = Stack(layout)
    assert stack.names("extra") == ["relay-2", "relay-3"]
    assert [stack.address(n) for n in stack.names("extra")] == [
        "127.0.0.1:9104",
        "127.0.0.1:9105",
    ]
    env = stack.app_env("relay-2", {"LEASEWORK_FAKE_CLOCK_OFFSET": "60"})
    assert env["LEASEWORK_PROCESS_NAME"] == "relay-2"
    assert env["LEASEWORK_OPS_ADDR"] == "127.0.0.1:9104"
    assert env["LEASEWORK_FAKE_CLOCK_OFFSET"] == "60"
    assert stack.service("relay-3").command()[-1] == "relay"
    assert {"relay-2", "relay-3"} <= set(STOP_TIERS[0])
    shown = {r.name for r in stack.status()}
    assert "relay" in shown and not shown & {"relay-2", "relay-3"}
    write_pidfile(layout.pidfile("relay-3"), 2**22 + 12345)  # started once, now gone
    rows = {r.name: r for r in stack.status()}
    assert "relay-2" not in rows and not rows["relay-3"].alive


def test_tail_shows_only_the_latest_run(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("old 1\n=== devstack A\nold 2\n=== devstack B\nnew 1\nnew 2\n")
    assert tail(log) == "=== devstack B\nnew 1\nnew 2"
    assert tail(log, 1) == "new 2"
    assert "no log file" in tail(tmp_path / "missing.log")
    err = StackError("kafka-1: not ready", log)
    assert "kafka-1: not ready" in str(err) and str(log) in str(err) and "new 2" in str(err)


def test_format_table() -> None:
    rows = [
        ServiceStatus("postgres", "infra", 10, True, True, "127.0.0.1:15433"),
        ServiceStatus("api", "app", None, False, False, "127.0.0.1:8080", "stale pidfile"),
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["NAME", "PID", "ALIVE", "READY", "ADDRESS", "NOTE"]
    assert lines[1].split() == ["postgres", "10", "yes", "yes", "127.0.0.1:15433"]
    assert lines[2].split()[:5] == ["api", "-", "no", "no", "127.0.0.1:8080"]
    assert lines[1].index("yes") == lines[2].index("no")  # columns aligned


def test_signal_names() -> None:
    assert _signal("KILL") == 9
    assert _signal("sigterm") == 15
    assert _signal("19") == 19


def test_each_service_recognises_its_own_command_and_no_other(tmp_path: Path, monkeypatch) -> None:
    """Identity by construction: the argv a service is started with satisfies its own
    ``owns`` check (right after exec, before any title rewrite) and nobody else's."""
    from devstack import tools
    from devstack.procs import ProcInfo
    from devstack.services import apps, build_services

    layout = Layout(tmp_path / "state", tmp_path / "cache", tmp_path / "repo")
    layout.kafka_libs.mkdir(parents=True)
    (layout.kafka_libs / "kafka_2.13-4.1.1.jar").touch()
    layout.toxiproxy_bin.parent.mkdir(parents=True)
    layout.toxiproxy_bin.touch()
    monkeypatch.setattr(tools, "require", lambda b: Path("/usr/bin") / b)
    services = build_services(layout)
    environs = {}
    infos = {}
    for pid, (name, svc) in enumerate(services.items(), start=1000):
        infos[name] = ProcInfo(pid, "S", pid, pid, tuple(svc.command()))
        environs[pid] = svc.env()
    monkeypatch.setattr(apps, "read_environ", lambda pid: environs[pid])
    for name, svc in services.items():
        for other, info in infos.items():
            assert svc.owns(info) == (name == other), (name, other)
    # after redis rewrote its process title
    titled = ProcInfo(1, "S", 1, 1, ("/usr/bin/redis-server 127.0.0.1:16380",))
    assert services["redis"].owns(titled)
    assert not services["redis"].owns(ProcInfo(1, "Z", 1, 1, titled.cmdline))


def test_untraversable_parent() -> None:
    import pwd
    import shutil
    import tempfile

    from devstack.services.postgres import untraversable_parent

    other = pwd.struct_passwd(("pg", "x", 54321, 54321, "", "/", "/bin/sh"))
    root = Path(tempfile.mkdtemp())  # pytest's tmp_path lives under a 0700 dir
    try:
        root.chmod(0o755)
        assert untraversable_parent(root / "state" / "postgres", other) is None
        closed = root / "closed"
        closed.mkdir()
        closed.chmod(0o700)  # like CI's `mktemp -d` checkout
        assert untraversable_parent(closed / "state" / "postgres", other) == closed
        assert untraversable_parent(closed, other) == closed
    finally:
        shutil.rmtree(root)


def test_starting_one_kafka_node_with_no_peer_running_starts_its_quorum(tmp_path: Path) -> None:
    stack = Stack(Layout(tmp_path, tmp_path, tmp_path))
    assert stack._quorum_peers_down("kafka-1") == ["kafka-2", "kafka-3"]
    assert stack._quorum_peers_down("redis") == []
