"""A scratch Redis group under Sentinel: a primary, a replica and one Sentinel, on free ports
under a directory of the caller's, for the tests that fail a primary over (the stack's own Redis
is a single server and stays one).

The same Debian ``redis-server`` binary runs all three (``--sentinel`` for the Sentinel). The
group is torn down, and its processes killed, when the context ends.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import tools
from .errors import StackError
from .layout import HOST

MASTER_NAME = "leasework"


@dataclass(frozen=True)
class SentinelGroup:
    primary_port: int
    replica_port: int
    sentinel_port: int
    master_name: str = MASTER_NAME

    @property
    def sentinels(self) -> str:
        return f"{HOST}:{self.sentinel_port}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def render_server_conf(port: int, data_dir: Path, primary_port: int | None = None) -> str:
    """A scratch server's redis.conf (pure): AOF, noeviction, a replica of ``primary_port``."""
    lines = [
        f"bind {HOST}",
        f"port {port}",
        f"dir {data_dir}",
        "appendonly yes",
        'save ""',
        "maxmemory-policy noeviction",
        'logfile ""',
    ]
    if primary_port is not None:
        lines.append(f"replicaof {HOST} {primary_port}")
    return "\n".join(lines) + "\n"


def render_sentinel_conf(port: int, primary_port: int, data_dir: Path) -> str:
    """The Sentinel's config (pure): it watches the primary with a quorum of one and declares
    it down after a second of silence."""
    return (
        "\n".join(
            [
                f"bind {HOST}",
                f"port {port}",
                f"dir {data_dir}",
                'logfile ""',
                f"sentinel monitor {MASTER_NAME} {HOST} {primary_port} 1",
                f"sentinel down-after-milliseconds {MASTER_NAME} 1000",
                f"sentinel failover-timeout {MASTER_NAME} 10000",
            ]
        )
        + "\n"
    )


def _wait(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
        time.sleep(0.1)
    raise StackError(f"sentinel group: {what} not ready within {timeout:g}s (last: {last!r})")


@contextlib.contextmanager
def scratch_sentinel_group(workdir: Path, timeout: float = 30.0) -> Iterator[SentinelGroup]:
    """Start the group, wait until the Sentinel knows the primary and its replica, yield it."""
    import redis

    binary = str(tools.require("redis-server"))
    group = SentinelGroup(_free_port(), _free_port(), _free_port())
    confs = {
        "primary": render_server_conf(group.primary_port, workdir / "primary"),
        "replica": render_server_conf(group.replica_port, workdir / "replica", group.primary_port),
        "sentinel": render_sentinel_conf(group.sentinel_port, group.primary_port, workdir),
    }
    started: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for name, text in confs.items():
            (workdir / name).mkdir(parents=True, exist_ok=True)
            conf = workdir / f"{name}.conf"
            conf.write_text(text)
            argv = [binary, str(conf), *(["--sentinel"] if name == "sentinel" else [])]
            log = (workdir / f"{name}.log").open("ab")
            logs.append(log)
            started.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log))
        sentinel = redis.Redis(host=HOST, port=group.sentinel_port, socket_timeout=1)
        _wait(
            "the Sentinel's view of the primary and its replica",
            lambda: (
                sentinel.sentinel_slaves(MASTER_NAME)
                and all(
                    r["master-link-status"] == "ok" for r in sentinel.sentinel_slaves(MASTER_NAME)
                )
            ),
            timeout,
        )
        sentinel.close()
        yield group
    finally:
        for proc in started:
            proc.kill()
        for proc in started:
            proc.wait(10)
        for log in logs:
            log.close()
