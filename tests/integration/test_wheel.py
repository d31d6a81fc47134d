"""The wheel alone: built from this checkout, installed into a fresh virtual environment with
only its declared dependencies, run from outside the checkout. (No stack needed; it is here
because it installs from the package index and takes some seconds.)"""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
