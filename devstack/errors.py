"""The one exception the supervisor raises, carrying the log tail that explains it."""

from __future__ import annotations

from pathlib import Path

TAIL_LINES = 30
# Every spawn/run writes a line starting with this into the log before the process output.
RUN_MARKER = "=== devstack "


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """Last ``lines`` lines of a (possibly huge, possibly missing) text file."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except FileNotFoundError:
        return f"(no log file at {path})"
    text = data.decode("utf-8", errors="replace").splitlines()[-lines:]
    # Show only the latest run when its start marker is within reach.
    starts = [i for i, line in enumerate(text) if line.startswith(RUN_MARKER)]
    if starts:
        text = text[starts[-1] :]
    return "\n".join(text)


class StackError(RuntimeError):
    """A step of bringing the stack up or down failed.

    ``str(err)`` names the step, the log file and shows the log's last lines.
    """

    def __init__(self, message: str, log: Path | None = None, lines: int = TAIL_LINES) -> None:
        self.message = message
        self.log = log
        text = message
        if log is not None:
            text += f"\n  log: {log}\n  --- last {lines} lines ---\n"
            text += "\n".join("  | " + line for line in tail(log, lines).splitlines())
        super().__init__(text)
