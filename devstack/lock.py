"""One supervisor at a time per state dir (``up``/``down``/``clean`` take an flock)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import StackError
from .progress import log


@contextmanager
def state_lock(path: Path, timeout: float = 600.0) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    log.info("waiting for another devstack command holding %s", path)
                    told = True
                if time.monotonic() >= deadline:
                    raise StackError(f"another devstack command holds {path}") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)
