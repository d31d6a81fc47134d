"""Process primitives: pidfiles, /proc identity checks, spawning, signalling, port owners.

Everything here is Linux-specific (reads /proc) and knows nothing about services.
A pid from a pidfile is only trusted when /proc/PID/cmdline (and, where asked,
/proc/PID/environ) still matches: pids get recycled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Children spawned by this Python process, so that we can reap them (a zombie is dead).
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: str
    pgrp: int
    session: int
    cmdline: tuple[str, ...]

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X", "x")


def read_proc(pid: int, proc: Path = Path("/proc")) -> ProcInfo | None:
    """Snapshot of /proc/PID, or None when there is no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) is in parentheses and may itself contain spaces or parentheses.
    fields = stat.rpartition(")")[2].split()
    cmdline = tuple(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
    return ProcInfo(pid, fields[0], int(fields[2]), int(fields[3]), cmdline)


def read_environ(pid: int, proc: Path = Path("/proc")) -> dict[str, str] | None:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep:
            env[key] = value
    return env


def cmdline_matches(cmdline: Sequence[str], markers: Sequence[str]) -> bool:
    """True when every marker occurs in the command line (joined by spaces).

    Markers are substrings, because some servers rewrite their process title
    (redis-server shows ``/usr/bin/redis-server 127.0.0.1:16380``).
    """
    if not cmdline:
        return False
    joined = " ".join(cmdline)
    return all(m in joined for m in markers)


def reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        del _children[pid]


def is_alive(pid: int) -> bool:
    reap(pid)
    info = read_proc(pid)
    return info is not None and info.alive


def read_pidfile(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        pid = int(text.split()[0])
    except (ValueError, IndexError):
        return None
    return pid if pid > 0 else None


def write_pidfile(path: Path, pid: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)


def remove_pidfile(path: Path) -> None:
    path.unlink(missing_ok=True)


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    cwd: Path | None = None,
) -> int:
    """Start a long-running process in its own session, stdout+stderr appended to
    ``log_path``. Returns its pid (== its process group id == its session id)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"\n=== devstack {stamp}: {' '.join(argv)}\n".encode())
        log.flush()
        extra: dict[str, object] = {}
        if user is not None:
            extra = {"user": user, "group": user, "extra_groups": []}
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            **extra,  # type: ignore[arg-type]
        )
    _children[child.pid] = child
    return child.pid


def send(pid: int, sig: int) -> bool:
    """Send ``sig`` to one process; False if it was already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def session_members(sid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live processes whose session id is ``sid`` (what we started with a new session)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        info = read_proc(int(entry.name), proc)
        if info is not None and info.alive and info.session == sid:
            found.append(info.pid)
    return found


def signal_session(sid: int, sig: int) -> int:
    """Signal every live member of session ``sid``; returns how many were signalled."""
    n = 0
    for pid in session_members(sid):
        n += send(pid, sig)
    return n


def wait_dead(pids: Sequence[int], timeout: float, interval: float = 0.1) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if is_alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(interval)


def terminate(
    targets: Sequence[tuple[int, int]], timeout: float, on_kill: Callable[[int], None] | None = None
) -> None:
    """Stop processes gracefully: ``targets`` are (pid, signal) pairs, all signalled at
    once; whoever is still alive after ``timeout`` gets SIGKILL; finally every leftover
    member of each pid's session (children, forked helpers) is SIGKILLed."""
    for pid, sig in targets:
        send(pid, sig)
        signal_session(pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
    pids = [pid for pid, _ in targets]
    for pid in wait_dead(pids, timeout):
        if on_kill is not None:
            on_kill(pid)
        send(pid, signal.SIGKILL)
    wait_dead(pids, 5.0)
    for pid in pids:
        leftovers = session_members(pid)
        signal_session(pid, signal.SIGKILL)
        reap(pid)
        wait_dead(leftovers, 5.0)  # SIGKILL is delivered, not yet done, when kill() returns


def pids_with_cwd(path: Path, proc: Path = Path("/proc")) -> list[int]:
    """Live processes whose working directory is ``path`` (postgres backends sit in
    their data dir and start their own sessions, so this is how we find strays)."""
    target = os.path.realpath(path)
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd") != target:
                continue
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _listen_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def port_owners(port: int) -> list[int]:
    """Pids of processes holding a listening TCP socket on ``port`` (any address)."""
    inodes = _listen_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    owners = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    owners.append(int(entry.name))
                    break
        except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
            continue
    return owners


def port_listening(port: int) -> bool:
    return bool(_listen_inodes(port))


def tcp_connectable(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def describe(pid: int) -> str:
    info = read_proc(pid)
    if info is None:
        return f"pid {pid} (gone)"
    cmd = " ".join(info.cmdline)
    if len(cmd) > 160:
        cmd = cmd[:157] + "..."
    return f"pid {pid} ({cmd})"


def run_logged(
    argv: Sequence[str], log: Path, heading: str, env: Mapping[str, str] | None = None
) -> int:
    """Run ``argv`` to completion, its output appended to ``log`` under a ``=== devstack
    HEADING:`` line; the exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== devstack {heading}: {' '.join(argv)}\n".encode())
        out.flush()
        return subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            check=False,
        ).returncode
