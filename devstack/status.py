"""Status records and their table rendering."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    kind: str  # "infra" | "app"
    pid: int | None  # pid of our live process, else the stale pid from the pidfile
    alive: bool
    ready: bool
    address: str
    note: str = ""


def _yn(flag: bool) -> str:
    return "yes" if flag else "no"


def format_table(rows: Sequence[ServiceStatus]) -> str:
    """Fixed-width table: NAME PID ALIVE READY ADDRESS NOTE (pure; unit-tested)."""
    header = ("NAME", "PID", "ALIVE", "READY", "ADDRESS", "NOTE")
    body = [
        (r.name, str(r.pid) if r.pid else "-", _yn(r.alive), _yn(r.ready), r.address, r.note)
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *body]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
