"""Every process's resources, sampled while the soak runs: for each service the devstack
started (its pid from ``$LEASEWORK_STATE_DIR/pids/NAME.pid``, so a process a fault restarted
is followed by name), VmRSS (``/proc/PID/status``), open descriptors (``/proc/PID/fd``), its
TCP connections to Postgres (its sockets whose peer is the Postgres proxy's or Postgres's port,
from ``/proc/net/tcp``: the leasework processes set no ``application_name``, and all of them
reach Postgres through Toxiproxy, so the server cannot tell them apart), and its process
tree's size and RssAnon (the postmaster's backends, the relay's lag probe); and Postgres's
own count of client connections (``pg_stat_activity``, by ``application_name``, without the
sampler's own), read on the direct port, where no toxic reaches.

The parsers take file contents (unit-tested); the readers are thin and blocking.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import psycopg
import trio

from devstack.layout import POSTGRES_DIRECT_DSN, POSTGRES_PORT, POSTGRES_PROXY_PORT
from devstack.procs import read_pidfile
from tools.bench.proc import PROC, descendants, read_all_stats
from tools.soak.goals import Reading

PG_PORTS = (POSTGRES_PROXY_PORT, POSTGRES_PORT)
ESTABLISHED = "01"
APPLICATION_NAME = "leasework-soak"
UNNAMED = "(none)"
SERVER_QUERY = (
    "SELECT coalesce(nullif(application_name, ''), %s) AS name, count(*) AS n "
    "FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
    "GROUP BY 1 ORDER BY 1"
)


# ---------------------------------------------------------------- parsers (pure)


def status_kib(text: str) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/PID/status`` (``VmRSS``, ``RssAnon``, ...) in KiB."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[key] = int(parts[0])
    return out


def peer_inodes(table: str, ports: Iterable[int]) -> set[str]:
    """Inodes of the established sockets in a ``/proc/net/tcp`` (or ``tcp6``) table whose
    remote port is one of ``ports``."""
    wanted = set(ports)
    out = set()
    for line in table.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or parts[3] != ESTABLISHED:
            continue
        try:
            port = int(parts[2].rsplit(":", 1)[1], 16)
        except (IndexError, ValueError):
            continue
        if port in wanted:
            out.add(parts[9])
    return out


def socket_inode(target: str) -> str | None:
    """``socket:[12345]`` (an fd's link) -> ``12345``."""
    if target.startswith("socket:[") and target.endswith("]"):
        return target[8:-1]
    return None


# ---------------------------------------------------------------- readers


@dataclass(frozen=True)
class Sample:
    """One sample of every process (``Reading.t`` holds the Unix time it was taken) and the
    server's count of connections by application name (None: unreadable)."""

    epoch: float
    readings: Mapping[str, Reading]
    server: Mapping[str, int] | None
    errors: tuple[str, ...] = ()

    @property
    def server_total(self) -> int | None:
        return None if self.server is None else sum(self.server.values())


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _fd_targets(pid: int, proc: Path) -> list[str] | None:
    try:
        entries = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return None
    targets = []
    for entry in entries:
        try:
            targets.append(os.readlink(entry))
        except OSError:
            continue  # closed while we looked
    return targets


def read_process(
    pid: int | None,
    epoch: float,
    pg_inodes: set[str],
    parents: Mapping[int, int],
    roots: Iterable[int],
    proc: Path = PROC,
) -> Reading:
    """One process now (blocking); a pid that is gone (or a zombie) reads as not running."""
    status = None if pid is None else _read(proc / str(pid) / "status")
    if pid is None or status is None or "\nState:\tZ" in status:
        return Reading(epoch, None)
    kib = status_kib(status)
    targets = _fd_targets(pid, proc)
    links = None
    if targets is not None:
        links = sum(1 for t in targets if socket_inode(t) in pg_inodes)
    members = descendants(pid, parents, roots) if pid in parents else [pid]
    anon = 0
    for member in members:
        text = status if member == pid else _read(proc / str(member) / "status")
        anon += status_kib(text or "").get("RssAnon", 0)
    return Reading(
        epoch,
        pid,
        rss_kib=kib.get("VmRSS"),
        fds=None if targets is None else len(targets),
        pg_links=links,
        tree=len(members),
        tree_anon_kib=anon,
    )


def read_server(dsn: str = POSTGRES_DIRECT_DSN) -> dict[str, int]:
    """Client connections by application name, as Postgres counts them (blocking)."""
    with psycopg.connect(
        dsn, autocommit=True, connect_timeout=5, application_name=APPLICATION_NAME
    ) as conn:
        rows = conn.execute(SERVER_QUERY, (UNNAMED,)).fetchall()
    return {str(name): int(n) for name, n in rows}


@dataclass
class ResourceSampler:
    """Samples ``names`` (their pids from ``pidfile(name)``) and the Postgres server every
    ``interval`` seconds into ``samples``."""

    names: Sequence[str]
    pidfile: Callable[[str], Path]
    interval: float = 60.0
    dsn: str = POSTGRES_DIRECT_DSN
    proc: Path = PROC
    samples: list[Sample] = field(default_factory=list)

    def read(self) -> Sample:
        """One sample now (blocking)."""
        epoch = time.time()
        errors: list[str] = []
        pids = {name: read_pidfile(self.pidfile(name)) for name in self.names}
        parents = {pid: s.ppid for pid, s in read_all_stats(self.proc).items()}
        tables = [_read(self.proc / "net" / name) or "" for name in ("tcp", "tcp6")]
        pg_inodes = set().union(*(peer_inodes(t, PG_PORTS) for t in tables))
        roots = [p for p in pids.values() if p is not None]
        readings = {
            name: read_process(pid, epoch, pg_inodes, parents, roots, self.proc)
            for name, pid in pids.items()
        }
        server: dict[str, int] | None
        try:
            server = read_server(self.dsn)
        except psycopg.Error as exc:
            server = None
            errors.append(f"pg_stat_activity: {exc}".strip()[:200])
        return Sample(epoch, readings, server, tuple(errors))

    async def sample(self) -> Sample:
        sample = await trio.to_thread.run_sync(self.read)
        self.samples.append(sample)
        return sample

    async def run(self, on_sample: Callable[[Sample], None] = lambda s: None) -> None:
        """Sample now and every ``interval`` seconds after, until cancelled."""
        next_at = trio.current_time()
        while True:
            on_sample(await self.sample())
            next_at += self.interval
            await trio.sleep_until(next_at)


def readings_by_process(samples: Sequence[Sample], zero: float) -> dict[str, list[Reading]]:
    """Each process's readings with ``t`` in seconds after ``zero`` (a Unix time)."""
    out: dict[str, list[Reading]] = {}
    for sample in samples:
        for name, reading in sample.readings.items():
            out.setdefault(name, []).append(replace(reading, t=round(reading.t - zero, 1)))
    return out


def server_points(samples: Sequence[Sample], zero: float) -> list[tuple[float, int]]:
    """The server's total of client connections, by seconds after ``zero``."""
    return [
        (round(s.epoch - zero, 1), s.server_total) for s in samples if s.server_total is not None
    ]
