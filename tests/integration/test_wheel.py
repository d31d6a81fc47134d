"""The wheel alone: built from this checkout, installed into a fresh virtual environment with
only its declared dependencies, run from outside the checkout: its migrations apply, its
api serves the console's templates and stylesheet, and its relay and worker get ready, against
the stack's Postgres, Redis and Kafka."""

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


# on demand, to keep CI under 25 minutes (80 s): in CI, tests/unit/test_packaging.py shows
# what the wheel ships and that its dependencies are exactly what the product imports
@pytest.mark.ondemand
def test_the_wheel_installs_alone_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("leasework-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"leasework"}
    shipped = set(names)
    assert "leasework/migrations/0001_jobs.sql" in shipped
    assert "leasework/api/console/static/console.css" in shipped
    assert "leasework/api/console/templates/console/base.html" in shipped

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    ran = subprocess.run(
        [str(env_dir / "bin" / "leasework"), "--help"],
        cwd=outside,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert "usage: leasework" in ran.stdout
    # every room imports from the installed wheel alone (no checkout on the path)
    imported = subprocess.run(
        [
            str(python),
            "-c",
            "import leasework.api, leasework.worker, leasework.relay, leasework.roles",
        ],
        cwd=outside,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.returncode == 0, imported.stderr

    # the migrations ship inside it (the stack's database is current: nothing to apply)
    migrated = subprocess.run(
        [str(env_dir / "bin" / "leasework"), "migrate"],
        cwd=outside,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert '"applied"' in migrated.stdout

    # its api runs from the wheel: templates and the stylesheet are inside it
    leasework = env_dir / "bin" / "leasework"
    with serving(leasework, "api", outside, tmp_path) as base:
        login = httpx.get(f"{base}/ui/login", timeout=5)
        assert login.status_code == 200 and "<form" in login.text
        stylesheet = httpx.get(f"{base}/ui/static/console.css", timeout=5)
        assert stylesheet.status_code == 200 and stylesheet.text.strip()
    # and so do the relay and a worker (a consumer group of its own: the stack's workers keep
    # their partitions), each ready: every dependency reached from the installed product
    for role in ("relay", "worker"):
        with serving(leasework, role, outside, tmp_path) as base:
            ready = httpx.get(f"{base}/readyz", timeout=5)
            assert ready.status_code == 200, ready.text


@contextlib.contextmanager
def serving(leasework: Path, role: str, cwd: Path, logs: Path) -> Iterator[str]:
    """``leasework ROLE`` from the wheel on a free ops port until /readyz answers 200; yields
    its base URL; the process is stopped (SIGTERM, its drain) when the block ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "LEASEWORK_APP": "leasework.demo:app",
        "LEASEWORK_OPS_ADDR": f"127.0.0.1:{port}",
        "LEASEWORK_PROCESS_NAME": f"{role}-from-wheel",
        "LEASEWORK_CONSUMER_GROUP": f"wheel-test-{uuid.uuid4()}",
    }
    log = logs / f"{role}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(leasework), role], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, f"the {role} from the wheel never got ready"
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
