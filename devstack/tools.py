"""Finding the binaries the stack runs (installing them is provision.py's job)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .errors import StackError

# binary -> Debian package that ships it
APT_PACKAGES: dict[str, str] = {
    "postgres": "postgresql",
    "initdb": "postgresql",
    "redis-server": "redis-server",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
    "java": "default-jre-headless",
    "mvn": "maven",
    # the console's browser tests (tests/integration/test_console.py) drive it with Playwright
    "chromium": "chromium",
}


def pg_bindir(root: Path = Path("/usr/lib/postgresql")) -> Path | None:
    """Newest Debian PostgreSQL server bin dir (``/usr/lib/postgresql/15/bin``)."""
    found = []
    for p in root.glob("*/bin/postgres"):
        if re.fullmatch(r"\d+", p.parent.parent.name):
            found.append((int(p.parent.parent.name), p.parent))
    return max(found)[1] if found else None


def find(binary: str) -> Path | None:
    if binary in ("postgres", "initdb"):
        d = pg_bindir()
        return d / binary if d is not None and (d / binary).exists() else None
    hit = shutil.which(binary)
    return Path(hit) if hit else None


def require(binary: str) -> Path:
    path = find(binary)
    if path is None:
        pkg = APT_PACKAGES.get(binary, binary)
        raise StackError(
            f"{binary} not found (Debian package {pkg}); run `python -m devstack provision`"
        )
    return path


def missing_apt_packages(need_mvn: bool = True) -> list[str]:
    """Debian packages to install so that every needed binary exists (mvn is only
    needed while the Kafka jars are not cached)."""
    pkgs = {pkg for b, pkg in APT_PACKAGES.items() if (need_mvn or b != "mvn") and find(b) is None}
    return sorted(pkgs)
