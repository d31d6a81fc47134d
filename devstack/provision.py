"""Provisioning: system packages (apt), Kafka jars (Maven), toxiproxy-server (go install).

Each step is idempotent. Downloads land in a ``*.partial`` directory and a ``.complete``
marker (holding a fingerprint of the recipe) is written only after the step finished,
so an interrupted download is redone and a changed pom/version is re-fetched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from . import procs, tools
from .errors import StackError
from .layout import ALERTMANAGER_PORT, PROMETHEUS_PORT, TOXIPROXY_VERSION, Layout
from .progress import log, step

TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def _run(argv: Sequence[str], log_path: Path, what: str, env: dict[str, str] | None = None) -> None:
    rc = procs.run_logged(argv, log_path, "provision", env)
    if rc != 0:
        raise StackError(f"provision: {what} failed (exit {rc})", log_path)


def _marker_ok(marker: Path, fingerprint: str) -> bool:
    try:
        return marker.read_text().strip() == fingerprint
    except FileNotFoundError:
        return False


@contextmanager
def _no_daemon_autostart() -> Iterator[None]:
    """Debian's standard switch (policy-rc.d exit 101) that stops package postinst
    scripts from starting their daemons (postgres on 5432, redis on 6379, prometheus on
    9090, alertmanager on 9093): we run our own. Only installed if no policy-rc.d exists already."""
    ours = not POLICY_RC_D.exists()
    if ours:
        POLICY_RC_D.write_text("#!/bin/sh\n# devstack provisioning\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        if ours:
            POLICY_RC_D.unlink(missing_ok=True)


def apt_command(packages: Sequence[str]) -> str:
    return "apt-get update && apt-get install -y --no-install-recommends " + " ".join(packages)


def ensure_system_packages(layout: Layout, need_mvn: bool = True) -> None:
    missing = tools.missing_apt_packages(need_mvn)
    if not missing:
        return
    if os.geteuid() != 0:
        raise StackError(
            f"provision: missing Debian packages {missing}; as root run:\n  " + apt_command(missing)
        )
    plog = layout.log("provision")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log.info("installing Debian packages: %s (log %s)", " ".join(missing), plog)
    with _no_daemon_autostart():
        # another apt-get (a second session, unattended upgrades) may hold the dpkg lock
        # for a while: wait for it rather than fail
        wait = ["-o", "DPkg::Lock::Timeout=300"]
        _run(["apt-get", *wait, "update"], plog, "apt-get update", env)
        _run(
            ["apt-get", *wait, "install", "-y", "--no-install-recommends", *missing],
            plog,
            "apt-get install",
            env,
        )
    still = tools.missing_apt_packages(need_mvn)
    if still:
        raise StackError(f"provision: still missing after apt-get install: {still}", plog)
    for port, init_script in (
        (PROMETHEUS_PORT, "prometheus"),
        (ALERTMANAGER_PORT, "prometheus-alertmanager"),
    ):
        owners = procs.port_owners(port)
        if owners:
            log.warning(
                "port %d is held by %s (not ours, maybe started by the package's init "
                "script); stop it, e.g. `/etc/init.d/%s stop`",
                port,
                ", ".join(procs.describe(p) for p in owners),
                init_script,
            )


def kafka_libs_cached(layout: Layout) -> bool:
    fingerprint = hashlib.sha256(layout.kafka_pom.read_bytes()).hexdigest()
    marker = layout.kafka_libs.parent / ".complete"
    return _marker_ok(marker, fingerprint) and any(layout.kafka_libs.glob("kafka_2.13-*.jar"))


def ensure_kafka_libs(layout: Layout) -> bool:
    """Kafka's runtime classpath via Maven. Returns True if it had to download."""
    if kafka_libs_cached(layout):
        return False
    libs = layout.kafka_libs
    root = libs.parent
    marker = root / ".complete"
    fingerprint = hashlib.sha256(layout.kafka_pom.read_bytes()).hexdigest()
    mvn = tools.require("mvn")
    tools.require("java")
    root.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    partial = root / "libs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    _run(
        [
            str(mvn),
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(layout.kafka_pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}",
        ],
        layout.log("provision"),
        "mvn dependency:copy-dependencies (Kafka jars)",
    )
    if not any(partial.glob("kafka_2.13-*.jar")):
        raise StackError(f"provision: mvn ran but no kafka_2.13 jar in {partial}")
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    marker.write_text(fingerprint + "\n")
    return True


def _go() -> Path:
    found = tools.find("go")
    if found is not None:
        return found
    if Path("/usr/local/go/bin/go").exists():
        return Path("/usr/local/go/bin/go")
    raise StackError(
        "provision: no Go toolchain (needed once to build toxiproxy-server "
        f"{TOXIPROXY_VERSION}); install Go >= 1.23 (Debian's golang-go is too old) "
        "and re-run `python -m devstack provision`"
    )


def ensure_toxiproxy(layout: Layout) -> bool:
    """Build toxiproxy-server with ``go install``. Returns True if it had to build."""
    target = layout.toxiproxy_bin
    root = target.parent
    marker = root / ".complete"
    fingerprint = f"{TOXIPROXY_MODULE}@v{TOXIPROXY_VERSION}"
    if _marker_ok(marker, fingerprint) and target.exists():
        return False
    go = _go()
    root.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    gobin = root / "gobin.partial"
    shutil.rmtree(gobin, ignore_errors=True)
    env = dict(os.environ, GOBIN=str(gobin), CGO_ENABLED="0")
    _run([str(go), "install", fingerprint], layout.log("provision"), "go install toxiproxy", env)
    built = gobin / "server"
    if not built.exists():
        raise StackError(f"provision: go install ran but {built} is missing")
    tmp = target.with_suffix(".tmp")
    shutil.move(str(built), tmp)
    tmp.replace(target)
    shutil.rmtree(gobin, ignore_errors=True)
    marker.write_text(fingerprint + "\n")
    return True


def stack_ports() -> set[int]:
    """Every port a process of the stack listens on."""
    from .layout import (
        ALERTMANAGER_PORT,
        APPS,
        EXTRA_RELAYS,
        KAFKA_NODE_IDS,
        PROMETHEUS_PORT,
        PROXIES,
        SHOP_MAIL_PORT,
        SHOP_PORT,
        TOXIPROXY_API_PORT,
        kafka_ports,
    )

    ports = {p for listen, upstream in PROXIES.values() for p in (listen, upstream)}
    ports |= {p for n in KAFKA_NODE_IDS for p in kafka_ports(n).values()}
    ports |= {port for _, port in (*APPS.values(), *EXTRA_RELAYS.values())}
    return ports | {
        ALERTMANAGER_PORT,
        PROMETHEUS_PORT,
        SHOP_MAIL_PORT,
        SHOP_PORT,
        TOXIPROXY_API_PORT,
    }


def reserved_ports_value(current: str, ephemeral: tuple[int, int], ports: set[int]) -> str:
    """``ip_local_reserved_ports`` with the stack's ports inside the ephemeral range added
    (pure): kafka-3's listen on 39092..39101, where the kernel also picks the source port of
    an outgoing connection, and a broker restarted while one holds its port cannot bind."""
    low, high = ephemeral
    wanted = {str(p) for p in ports if low <= p <= high}
    have = [part for part in current.strip().split(",") if part]
    missing = sorted(wanted - set(have), key=int)
    return ",".join([*have, *missing])


def reserve_ports(proc: Path = Path("/proc/sys/net/ipv4")) -> None:
    """Keep the kernel from handing out the stack's ports as source ports (root only; a
    best effort: without it a clash shows as a broker that cannot bind, in its log)."""
    try:
        low, high = (int(x) for x in (proc / "ip_local_port_range").read_text().split())
        path = proc / "ip_local_reserved_ports"
        current = path.read_text()
        value = reserved_ports_value(current, (low, high), stack_ports())
        if value != current.strip():
            path.write_text(value + "\n")
    except (OSError, ValueError) as exc:
        log.debug("could not reserve the stack's ports: %s", exc)


def provision(layout: Layout) -> None:
    """Everything the stack needs on disk; cheap when already done."""
    layout.ensure_dirs()
    reserve_ports()
    with step("provision: system packages"):
        ensure_system_packages(layout, need_mvn=not kafka_libs_cached(layout))
    with step("provision: kafka jars"):
        ensure_kafka_libs(layout)
    with step("provision: toxiproxy-server"):
        ensure_toxiproxy(layout)
