"""``/proc`` accounting for the bench: CPU ticks and peak RSS per process tree.

A *tree* is a named root pid (the postmaster, a JVM, a leasework process, the bench itself)
and all its live descendants. Its CPU is the sum over the members of utime + stime + cutime
+ cstime: a child that exits and is reaped moves its whole time (its children's included)
into its parent's cutime/cstime, so the sum never loses a reaped child and never counts one
twice, and a postgres backend that connects and leaves inside a window is still counted.

Peak RSS: ``echo 5 > /proc/PID/clear_refs`` resets VmHWM at a window's start, VmHWM at its
end is the peak since. A member that exits inside the window takes its peak with it.

The parsers take file contents (unit-tested); the readers are thin.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Stat:
    pid: int
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int

    @property
    def ticks(self) -> int:
        return self.utime + self.stime + self.cutime + self.cstime


def parse_stat(text: str) -> Stat:
    """One ``/proc/PID/stat`` line. comm (field 2) is in parentheses and may hold spaces and
    parentheses itself, so split after the last ``)``."""
    head, _, rest = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    f = rest.split()
    # rest starts at field 3 (state): ppid is field 4, utime..cstime are fields 14..17
    return Stat(pid, int(f[1]), int(f[11]), int(f[12]), int(f[13]), int(f[14]))


def parse_vmhwm_kib(status_text: str) -> int | None:
    """``VmHWM:   12345 kB`` from ``/proc/PID/status`` (None for a kernel thread/zombie)."""
    for line in status_text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def descendants(root: int, parents: Mapping[int, int], stop: Iterable[int] = ()) -> list[int]:
    """``root`` and every pid whose parent chain reaches it (``parents``: pid -> ppid),
    not descending into the pids in ``stop`` (the roots of other trees: the bench spawns the
    leasework processes it restarts, and they must not count as the bench's)."""
    stop = set(stop) - {root}
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in out or pid in stop:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return sorted(out)


def tree_ticks(root: int, stats: Mapping[int, Stat], stop: Iterable[int] = ()) -> int | None:
    """CPU ticks of ``root``'s tree (see the module doc; ``stop`` as for
    :func:`descendants`), or None when root is gone."""
    if root not in stats:
        return None
    members = descendants(root, {pid: s.ppid for pid, s in stats.items()}, stop)
    return sum(stats[pid].ticks for pid in members if pid in stats)


def cpu_ms_per_job(
    start: Mapping[str, int | None], end: Mapping[str, int | None], jobs: int
) -> dict[str, float | None]:
    """Per name, CPU milliseconds per job between two tick snapshots, plus ``total`` (over
    the names measured at both ends). None where a tree was missing at either end (restarted
    or not running)."""
    out: dict[str, float | None] = {}
    total = 0.0
    for name, before in start.items():
        after = end.get(name)
        if before is None or after is None or after < before or jobs <= 0:
            out[name] = None
            continue
        ms = (after - before) * 1000.0 / CLK_TCK / jobs
        out[name] = ms
        total += ms
    out["total"] = total
    return out


def parse_machine_ticks(proc_stat_text: str) -> tuple[int, int]:
    """(busy, total) ticks over all CPUs from the first line of ``/proc/stat``: busy is
    everything but idle and iowait; guest time is already inside user."""
    fields = [int(x) for x in proc_stat_text.splitlines()[0].split()[1:]]
    values = fields[:8]  # user nice system idle iowait irq softirq steal
    total = sum(values)
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return total - idle, total


def accounted(
    ticks: Mapping[str, int | None], start: tuple[int, int], end: tuple[int, int]
) -> float | None:
    """The share of the machine's busy CPU time that the named trees account for (what is
    missing ran in processes the bench does not name: kernel threads, anyone else's work)."""
    busy = end[0] - start[0]
    return sum(t for t in ticks.values() if t is not None) / busy if busy > 0 else None


def busy_fraction(start: tuple[int, int], end: tuple[int, int]) -> float | None:
    busy = end[0] - start[0]
    total = end[1] - start[1]
    return busy / total if total > 0 else None


# --- readers ----------------------------------------------------------------------------
def read_all_stats(proc: Path = PROC) -> dict[int, Stat]:
    stats = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stats[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    return stats


def snapshot(roots: Mapping[str, int | None], proc: Path = PROC) -> dict[str, int | None]:
    """Ticks per named tree, all from one scan of /proc."""
    stats = read_all_stats(proc)
    others = {pid for pid in roots.values() if pid is not None}
    return {
        name: (None if pid is None else tree_ticks(pid, stats, others))
        for name, pid in roots.items()
    }


def machine_ticks(proc: Path = PROC) -> tuple[int, int]:
    return parse_machine_ticks((proc / "stat").read_text())


def tree_members(roots: Mapping[str, int | None], proc: Path = PROC) -> dict[str, list[int]]:
    stats = read_all_stats(proc)
    parents = {pid: s.ppid for pid, s in stats.items()}
    others = {pid for pid in roots.values() if pid is not None}
    return {
        name: ([] if pid is None or pid not in stats else descendants(pid, parents, others))
        for name, pid in roots.items()
    }


def reset_peaks(pids: Iterable[int], proc: Path = PROC) -> None:
    for pid in pids:
        try:
            (proc / str(pid) / "clear_refs").write_text("5")
        except OSError:
            pass  # gone, or not ours to reset: its VmHWM is then the peak since it started


def read_peaks_kib(pids: Iterable[int], proc: Path = PROC) -> dict[int, int]:
    out = {}
    for pid in pids:
        try:
            value = parse_vmhwm_kib((proc / str(pid) / "status").read_text())
        except OSError:
            continue
        if value is not None:
            out[pid] = value
    return out


def peak_rss_mib(members: Mapping[str, list[int]], peaks: Mapping[int, int]) -> dict[str, dict]:
    """Per tree: ``max`` (the largest member's VmHWM) and ``sum`` (over members; shared
    memory, such as Postgres' shared buffers, is counted once per member) in MiB."""
    out = {}
    for name, pids in members.items():
        values = [peaks[p] for p in pids if p in peaks]
        out[name] = {
            "max": max(values) / 1024 if values else None,
            "sum": sum(values) / 1024 if values else None,
            "processes": len(values),
        }
    return out


class Window:
    """CPU ticks, peak RSS and machine busy time of every process tree over one window."""

    def __init__(self, roots: dict[str, int | None]) -> None:
        self.roots = roots
        reset_peaks(p for pids in tree_members(roots).values() for p in pids)
        self.start_ticks = snapshot(roots)
        self.start_machine = machine_ticks()
        self.started = time.monotonic()

    def stop(self, jobs: int) -> dict[str, Any]:
        end_ticks = snapshot(self.roots)
        end_machine = machine_ticks()
        seconds = time.monotonic() - self.started
        members = tree_members(self.roots)
        peaks = read_peaks_kib(p for pids in members.values() for p in pids)
        ticks = {n: _delta(self.start_ticks[n], end_ticks.get(n)) for n in self.roots}
        return {
            "window_s": seconds,
            "cpu_ms_per_job": cpu_ms_per_job(self.start_ticks, end_ticks, jobs),
            "cpu_ticks": ticks,
            "machine_busy": busy_fraction(self.start_machine, end_machine),
            "accounted_of_busy": accounted(ticks, self.start_machine, end_machine),
            "rss_mib": peak_rss_mib(members, peaks),
        }


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else b - a
