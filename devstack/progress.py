"""Short progress lines on stderr with elapsed seconds, so ``just up`` shows where time goes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("devstack")


def setup_logging(verbose: bool = False) -> None:
    """Configure stderr logging for the CLI (library users keep their own setup)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="[stack] %(message)s",
    )
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextmanager
def step(what: str) -> Iterator[None]:
    """Log ``what ...`` then ``what: ok (1.2s)`` or ``what: FAILED (1.2s)``."""
    t0 = time.monotonic()
    log.info("%s ...", what)
    try:
        yield
    except BaseException:
        log.info("%s: FAILED (%.1fs)", what, time.monotonic() - t0)
        raise
    log.info("%s: ok (%.1fs)", what, time.monotonic() - t0)
