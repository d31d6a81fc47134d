"""How fast the machine is while a row runs: a probe process times a fixed piece of work.

This VM's CPUs do the same work in anything from about 9 to 32 ms of CPU time from one
minute to the next (the host's doing; measured in docs/design-decisions.md, "A row's CPU per
job moves with the machine's speed"). A row's CPU milliseconds per job then say as much about
the minute it ran in as about the code, and there are no hardware counters here to count
instructions instead. So while the bench runs, a process of its own does one fixed unit of
pure-Python work (:func:`unit`) every :data:`INTERVAL` seconds and prints the CPU time it
took; a row's speed is the median over its throughput window (:meth:`SpeedProbe.window`).
Lower is faster. The probe's own CPU (about 1% of two cores) is in the machine's busy share,
not in any process's figures.

``python -m tools.bench.speed`` is the probe itself: one line per unit, ``<epoch seconds>
<CPU ms>``, until it is killed.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tools.bench.report import spread

INTERVAL = 1.0  # seconds between two units
LOOP = 100_000  # iterations of a unit: about 9 ms of CPU in the machine's fast minutes


def unit(loop: int = LOOP) -> float:
    """CPU milliseconds this process spent on one fixed unit of work: dictionary stores and
    integer arithmetic in the interpreter, what the stack's Python processes do most."""
    started = time.process_time()
    table: dict[int, int] = {}
    total = 0
    for i in range(loop):
        table[i % 1000] = total
        total += i * 3 % 7
    return (time.process_time() - started) * 1000


def summary(samples: Sequence[tuple[float, float]], start: float, end: float) -> dict:
    """Median, lowest and highest CPU ms of the units timed between ``start`` and ``end``
    (epoch seconds), and how many (:func:`tools.bench.report.spread`; None where none was)."""
    return spread([ms for at, ms in samples if start <= at <= end])


def parse(line: str) -> tuple[float, float] | None:
    """One probe line as (epoch seconds, CPU ms); None for anything else."""
    parts = line.split()
    if len(parts) != 2:
        return None
    try:
        return float(parts[0]), float(parts[1])
    except ValueError:
        return None


class SpeedProbe:
    """The probe process for the length of a ``with`` block; its samples read as they come."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> SpeedProbe:
        """Start the probe process, and a thread that reads its lines."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tools.bench.speed", str(self.interval)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],  # the repository, for ``-m``
        )
        self._reader = threading.Thread(target=self._read, name="speed-probe", daemon=True)
        self._reader.start()
        return self

    def __enter__(self) -> SpeedProbe:
        return self.start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            if (sample := parse(line)) is not None:
                self.samples.append(sample)

    def window(self, start: float, end: float) -> dict:
        """The probe's :func:`summary` over one window (epoch seconds)."""
        return summary(list(self.samples), start, end)

    def stop(self) -> None:
        """Stop the probe process; what it timed stays readable."""
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._process is not None and self._process.stdout is not None:
            self._process.stdout.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str]) -> None:
    interval = float(argv[0]) if argv else INTERVAL
    while True:
        spent = unit()
        print(f"{time.time():.3f} {spent:.3f}", flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (KeyboardInterrupt, BrokenPipeError):
        pass
