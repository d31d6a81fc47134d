"""The Stack: one synchronous object that provisions, starts, stops and inspects the
local leasework stack. The CLI, the tests and the chaos harness all drive this.

Identity of a running service = its pidfile's pid is alive and /proc/PID matches the
service (see ``Service.owns``). Anything else on one of our ports is "foreign" and is
reported, never killed.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from . import procs
from .errors import StackError, tail
from .layout import EXTRA_RELAYS, KAFKA_NODE_IDS, Layout
from .lock import state_lock
from .progress import log, step
from .provision import provision as _provision
from .readiness import wait_until
from .services import Service, build_services
from .services import toxiproxy as toxi
from .services.apps import ensure_tokens
from .services.apps import run_migrate as _run_migrate
from .services.kafka_admin import (
    cluster_problems,
    elect_preferred_leaders,
    ensure_scram_user,
    ensure_topics,
)
from .services.prometheus import scratch_prometheus as _scratch_prometheus
from .status import ServiceStatus

KAFKA_NAMES = tuple(f"kafka-{n}" for n in KAFKA_NODE_IDS)
# Stop order for `down`: each tier is stopped in parallel, apps first.
STOP_TIERS: tuple[tuple[str, ...], ...] = (
    ("api", "relay", *EXTRA_RELAYS, "worker-1", "worker-2", "shop"),
    ("prometheus", "alertmanager", *KAFKA_NAMES),
    ("toxiproxy", "redis", "postgres"),
)


class Stack:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._services = build_services(layout)
        self._lock_depth = 0

    @classmethod
    def from_env(cls) -> Stack:
        """Paths from ``LEASEWORK_STATE_DIR`` / ``LEASEWORK_CACHE_DIR``; repo = this checkout."""
        return cls(Layout.from_env())

    # --- lookup ---------------------------------------------------------------------
    def names(self, kind: str | None = None) -> list[str]:
        """Service names in start order; ``kind`` is "infra", "app" (leasework processes),
        "example" (the example shop) or "extra" (relays only a chaos scenario starts) to
        filter."""
        return [n for n, s in self._services.items() if kind is None or s.kind == kind]

    def service(self, name: str) -> Service:
        try:
            return self._services[name]
        except KeyError:
            raise StackError(
                f"unknown service {name!r}; known: {', '.join(self.names())}"
            ) from None

    def address(self, name: str) -> str:
        return self.service(name).address()

    def log_path(self, name: str) -> Path:
        return self.layout.log(name)

    # --- process identity -------------------------------------------------------------
    def _recorded_pid(self, name: str) -> int | None:
        return procs.read_pidfile(self.layout.pidfile(name))

    def pid(self, name: str) -> int | None:
        """Pid of the running service, or None (no pidfile, dead, or pid recycled)."""
        svc = self.service(name)
        pid = self._recorded_pid(name)
        if pid is None:
            return None
        procs.reap(pid)
        info = procs.read_proc(pid)
        return pid if info is not None and svc.owns(info) else None

    def is_running(self, name: str) -> bool:
        return self.pid(name) is not None

    def is_ready(self, name: str) -> bool:
        if not self.is_running(name):
            return False
        try:
            return bool(self.service(name).probe())
        except Exception:  # noqa: BLE001 - any probe failure means "not ready"
            return False

    def _foreign_owners(self, svc: Service) -> list[tuple[int, int]]:
        """(port, pid) of processes other than our recorded one listening on svc's ports."""
        ours = self.pid(svc.name)
        found = []
        for port in svc.ports():
            for owner in procs.port_owners(port):
                info = procs.read_proc(owner)
                if ours is not None and (owner == ours or (info and info.session == ours)):
                    continue
                found.append((port, owner))
        return found

    def _adopt_or_refuse(self, svc: Service) -> int | None:
        """Before spawning: a process on our port that *is* this service (pidfile lost)
        is adopted; anything else is a clear error."""
        foreign = self._foreign_owners(svc)
        for _port, owner in foreign:
            info = procs.read_proc(owner)
            if info is not None and svc.owns(info):
                procs.write_pidfile(self.layout.pidfile(svc.name), owner)
                log.info("%s: adopted running pid %d (its pidfile was missing)", svc.name, owner)
                return owner
        if foreign:
            lines = "\n".join(
                f"  port {port}: {procs.describe(pid)}" for port, pid in sorted(set(foreign))
            )
            hint = "`kill PID`"
            if svc.init_script:
                hint += f", or `/etc/init.d/{svc.init_script} stop` if its package started it"
            raise StackError(
                f"{svc.name}: cannot start, its port is held by a process devstack did not "
                f"start:\n{lines}\n  stop it ({hint}) and retry"
            )
        return None

    def _cleanup_stale(self, name: str) -> None:
        """Pidfile points at a dead process: kill what is left of its session, drop it."""
        pid = self._recorded_pid(name)
        if pid is None:
            return
        if procs.read_proc(pid) is None:  # not merely recycled: gone, so its sid is free
            procs.signal_session(pid, signal.SIGKILL)
            procs.wait_dead(procs.session_members(pid), 5.0)
        self._kill_strays(name)
        procs.remove_pidfile(self.layout.pidfile(name))

    def _kill_strays(self, name: str) -> None:
        strays = self.service(name).strays()
        if strays:
            log.warning("%s: killing %d leftover process(es) %s", name, len(strays), strays)
            for pid in strays:
                procs.send(pid, signal.SIGKILL)
            procs.wait_dead(strays, 5.0)

    # --- start / wait -------------------------------------------------------------
    def _launch(self, name: str, extra_env: Mapping[str, str] | None = None) -> tuple[int, bool]:
        """Start ``name`` unless it runs; returns (pid, fresh). Does not wait."""
        svc = self.service(name)
        pid = self.pid(name)
        if pid is not None:
            if extra_env:
                raise StackError(
                    f"{name} is already running (pid {pid}); extra_env would be ignored: "
                    "stop it first or use restart()"
                )
            self._signal_all(name, pid, signal.SIGCONT)  # harmless unless it was paused
            return pid, False
        self._cleanup_stale(name)
        adopted = self._adopt_or_refuse(svc)
        if adopted is not None:
            return adopted, False
        self.layout.ensure_dirs()
        svc.prepare()
        try:
            pid = procs.spawn(
                svc.command(),
                self.layout.log(name),
                env=svc.env(extra_env),
                user=svc.run_as(),
                cwd=svc.cwd(),
            )
        except OSError as e:
            raise StackError(f"{name}: cannot start {svc.command()[0]}: {e}") from e
        procs.write_pidfile(self.layout.pidfile(name), pid)
        log.info("%s: started pid %d (log %s)", name, pid, self.layout.log(name))
        return pid, True

    def _still_running(self, name: str, grace: float = 1.0) -> bool:
        """is_running, asked again for ``grace`` seconds before saying no: a process that
        rewrites its title (redis does, at start) can be read from /proc mid-rewrite, and one
        such read must not count as a death."""
        deadline = time.monotonic() + grace
        while not self.is_running(name):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def wait_ready(self, name: str, timeout: float | None = None) -> float:
        """Poll the service's readiness probe; StackError (with log tail) if it dies or
        times out. Returns the seconds waited."""
        svc = self.service(name)
        if not self._still_running(name):
            raise StackError(f"{name}: not running", self.layout.log(name))
        return wait_until(
            name,
            svc.probe,
            svc.ready_timeout if timeout is None else timeout,
            alive=lambda: self._still_running(name),
            log=self.layout.log(name),
        )

    def _settle(self, name: str, fresh: bool, timeout: float | None) -> None:
        what = f"{name}: ready" if fresh else f"{name}: already running, check ready"
        with step(what):
            self.wait_ready(name, timeout)
            self.service(name).after_ready(fresh)

    def start(
        self,
        name: str,
        extra_env: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> int:
        """Start one service (no-op if it runs and no ``extra_env`` is given); by default
        wait until ready. Returns its pid.

        A Kafka node whose quorum peers are all down starts them with it: a lone KRaft node
        cannot reach a quorum of voters, gives up and exits, so starting the nodes one at a
        time after all three died would never recover."""
        peers = self._quorum_peers_down(name)
        if peers:
            log.info(
                "%s: its quorum peers %s are down too; starting them with it (a lone KRaft "
                "node cannot form a quorum)",
                name,
                ", ".join(peers),
            )
            launched = {
                n: self._launch(n, extra_env if n == name else None) for n in (name, *peers)
            }
            if wait:
                for node, (_pid, fresh) in launched.items():
                    self._settle(node, fresh, timeout)
            return launched[name][0]
        pid, fresh = self._launch(name, extra_env)
        if wait:
            self._settle(name, fresh, timeout)
        return pid

    def _quorum_peers_down(self, name: str) -> list[str]:
        """The other Kafka nodes, when ``name`` is one and none of them runs (no quorum)."""
        if name not in KAFKA_NAMES or self.is_running(name):
            return []
        others = [n for n in KAFKA_NAMES if n != name]
        return [] if any(self.is_running(n) for n in others) else others

    def restart(
        self, name: str, extra_env: Mapping[str, str] | None = None, timeout: float = 20.0
    ) -> int:
        self.stop(name, timeout=timeout)
        return self.start(name, extra_env)

    # --- stop / signals -------------------------------------------------------------
    def stop_many(self, names: Sequence[str], timeout: float | None = None) -> None:
        """Stop services in parallel: their stop signal, then SIGKILL after ``timeout``
        (default: each service's own), then leftovers of their sessions."""
        targets = []
        for name in names:
            svc = self.service(name)
            pid = self.pid(name)
            if pid is None:
                self._cleanup_stale(name)
                continue
            self._signal_all(name, pid, signal.SIGCONT)  # a paused process can't stop
            targets.append((name, pid, svc.stop_signal))
        if not targets:
            return
        limit = timeout
        if limit is None:
            limit = max(self.service(n).stop_timeout for n, _, _ in targets)
        by_pid = {pid: name for name, pid, _ in targets}

        def on_kill(pid: int) -> None:
            log.warning("%s: still alive after %.0fs, SIGKILL", by_pid[pid], limit)

        procs.terminate([(pid, sig) for _, pid, sig in targets], limit, on_kill)
        for name, pid, _ in targets:
            if procs.is_alive(pid):
                raise StackError(f"{name}: pid {pid} survived SIGKILL", self.layout.log(name))
            self._kill_strays(name)
            procs.remove_pidfile(self.layout.pidfile(name))
            log.info("%s: stopped (pid %d)", name, pid)

    def stop(self, name: str, timeout: float = 20.0) -> None:
        self.stop_many([name], timeout)

    def _require_pid(self, name: str) -> int:
        pid = self.pid(name)
        if pid is None:
            raise StackError(f"{name} is not running")
        return pid

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the service's main process only (crash injection). The pidfile
        stays, so ``start``/``up`` later sees a dead pid and restarts it."""
        pid = self._require_pid(name)
        procs.send(pid, sig)
        if sig == signal.SIGKILL:
            procs.wait_dead([pid], 5.0)
        return pid

    def _signal_all(self, name: str, pid: int, sig: int) -> None:
        """Signal the service's whole session plus its strays (postgres backends)."""
        members = set(procs.session_members(pid)) | set(self.service(name).strays())
        for member in members:
            procs.send(member, sig)

    def pause(self, name: str) -> None:
        """SIGSTOP every process of the service (like `docker pause`)."""
        self._signal_all(name, self._require_pid(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self._signal_all(name, self._require_pid(name), signal.SIGCONT)

    # --- whole stack --------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        self.layout.ensure_dirs()
        with state_lock(self.layout.state_dir / ".lock"):
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0

    def provision(self) -> None:
        _provision(self.layout)

    def scratch_prometheus(
        self, workdir: Path, *, run: str | None = None
    ) -> contextlib.AbstractContextManager[str]:
        """A throwaway Prometheus with an empty TSDB, the stack's targets and rules, sending
        to the stack's Alertmanager labelled with ``run``; yields its URL (see
        :func:`services.prometheus.scratch_prometheus`)."""
        return _scratch_prometheus(self.layout, workdir, run=run)

    def up(self, apps: bool = True, timeout: float | None = None, mode: str | None = None) -> None:
        """Provision, start everything not running, wait until all is ready. Idempotent.

        ``mode`` (``plain`` or ``secure``) is which listeners leasework's own processes use
        from now on (kept in the state dir; None keeps the current one); processes started in
        the other mode are restarted, as any with outdated stack defaults.

        A running service started with an outdated configuration (see ``Service.stale``:
        a Kafka node's server.properties, a leasework process's stack defaults) is
        restarted, one at a time; after each Kafka node the whole cluster must be ready
        again (all brokers, leaders, ISR >= 2) before the next one goes down. Then every
        partition's leadership goes back to its preferred replica (brokers started one after
        another leave the first one leading all of them)."""
        t0 = time.monotonic()
        with self._locked():
            if mode is not None:
                self.layout.ensure_dirs()
                self.layout.mode_file.write_text(mode + "\n")
            self.provision()
            infra = self.names("infra")
            fresh = {}
            with step("launch infrastructure"):
                self._prepare_parallel(("postgres", *KAFKA_NAMES))
                for name in infra:
                    fresh[name] = self._launch(name)[1]
            for name in infra:
                self._settle(name, fresh[name], timeout)
            self.restart_stale(("postgres", "redis"), timeout)
            with step("toxiproxy: reset toxics"):
                toxi.reset()
            with step("kafka: topics"):
                created = ensure_topics()
                if created:
                    log.info("created topics: %s", ", ".join(created))
            with step("kafka: cluster ready (3 brokers, leaders, ISR>=2)"):
                self.wait_kafka_cluster(timeout or 120.0)
            self.restart_stale(
                KAFKA_NAMES, timeout, then=lambda: self.wait_kafka_cluster(timeout or 120.0)
            )
            with step("kafka: leaders on their preferred replicas"):
                moved, off = elect_preferred_leaders()
                if moved or off:
                    log.info("leaders moved back: %d; still off their preferred: %d", moved, off)
            with step("kafka: SCRAM user of the SECURE listeners"):
                ensure_scram_user()
            if apps:
                self._up_apps(timeout)
        log.info("up: done in %.1fs", time.monotonic() - t0)

    def stale(self, name: str) -> list[str]:
        """What the running ``name`` was started with that differs from a start now
        (empty when it is up to date or not running)."""
        pid = self.pid(name)
        return [] if pid is None else self.service(name).stale(pid)

    def restart_stale(
        self,
        names: Sequence[str],
        timeout: float | None = None,
        then: Callable[[], object] | None = None,
    ) -> list[str]:
        """Restart, one at a time and each until ready, the running services among
        ``names`` whose configuration is outdated; ``then()`` runs after each restart.
        Deliberate ``extra_env`` overrides of a leasework process are kept. Returns the
        names restarted."""
        done = []
        for name in names:
            pid = self.pid(name)
            if pid is None:
                continue
            svc = self.service(name)
            reasons = svc.stale(pid)
            if not reasons:
                continue
            keep = svc.restart_env(pid)
            log.info("%s: started with an outdated %s, restarting it", name, ", ".join(reasons))
            with step(f"{name}: restart"):
                self.stop_many([name])
                self.start(name, extra_env=keep or None, timeout=timeout)
                if then is not None:
                    then()
            done.append(name)
        return done

    def _up_apps(self, timeout: float | None) -> None:
        names = self.names("app") + self.names("example")
        if not all(self.is_running(n) for n in names):
            self.run_migrate()
        with step("leasework: tokens"):
            ensure_tokens(self.layout)
        fresh = {}
        for name in names:
            fresh[name] = self._launch(name)[1]
        for name in names:
            self._settle(name, fresh[name], timeout)
        self.restart_stale(names, timeout)

    def _prepare_parallel(self, names: Sequence[str]) -> None:
        """Run prepare() (initdb, Kafka storage formatting: a JVM each) concurrently for
        services that are not running; _launch's own prepare() then finds them done."""
        todo = [self.service(n) for n in names if not self.is_running(n)]
        if len(todo) < 2:
            return
        with ThreadPoolExecutor(len(todo)) as pool:
            for fut in [pool.submit(svc.prepare) for svc in todo]:
                fut.result()

    def up_infra(self, timeout: float | None = None) -> None:
        self.up(apps=False, timeout=timeout)

    def wait_kafka_cluster(self, timeout: float = 120.0) -> float:
        """Wait until all brokers are in the metadata and every partition of the stack's
        topics has a leader and ISR >= 2."""
        last: list[str] = []

        def probe() -> bool:
            last[:] = cluster_problems()
            return not last

        try:
            return wait_until("kafka cluster", probe, timeout)
        except StackError as e:
            raise StackError(f"{e.message}; problems: {'; '.join(last[:5])}") from None

    def app_env(self, name: str, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full environment ``start(name, extra_env)`` would give a leasework process
        (for tests that launch an extra process of the same kind by hand)."""
        svc = self.service(name)
        if svc.kind not in ("app", "extra"):
            raise StackError(f"{name} is not a leasework process")
        return svc.env(extra_env)

    def run_migrate(self, extra_env: Mapping[str, str] | None = None) -> None:
        """Run ``python -m leasework migrate`` to completion (StackError on failure)."""
        with step("leasework: migrate"):
            _run_migrate(self.layout, extra_env)

    def down(self, timeout: float | None = None) -> None:
        """Stop everything this stack started (by recorded pid), apps first."""
        with self._locked():
            for tier in STOP_TIERS:
                with step(f"stop {', '.join(tier)}"):
                    self.stop_many(tier, timeout)
            leftovers = [
                (svc.name, port, pid)
                for svc in self._services.values()
                for port in svc.ports()
                for pid in procs.port_owners(port)
            ]
            for name, port, pid in leftovers:
                log.warning(
                    "port %d (%s) is still held by %s, not started by devstack",
                    port,
                    name,
                    procs.describe(pid),
                )

    def clean(self) -> None:
        """down, then delete the state dir (data, logs, configs)."""
        with self._locked():
            self.down()
            with step(f"delete {self.layout.state_dir}"):
                shutil.rmtree(self.layout.state_dir, ignore_errors=False)

    # --- inspection / helpers -----------------------------------------------------------
    def status(self) -> list[ServiceStatus]:
        rows = []
        for name, svc in self._services.items():
            pid = self.pid(name)
            note = ""
            recorded = self._recorded_pid(name)
            if svc.kind == "extra" and recorded is None:
                continue  # a relay only a chaos scenario starts, and none has
            if pid is None and recorded is not None:
                other = procs.read_proc(recorded)
                gone = other is None or not other.alive
                note = f"stale pidfile (pid {recorded} is {'gone' if gone else 'not ours'})"
            if pid is not None:
                reasons = svc.stale(pid)
                if reasons:
                    note = f"outdated {', '.join(reasons)}: `up` restarts it"
            foreign = self._foreign_owners(svc)
            if foreign:
                port, owner = foreign[0]
                note = f"FOREIGN pid {owner} on port {port}"
            rows.append(
                ServiceStatus(
                    name=name,
                    kind=svc.kind,
                    pid=pid if pid is not None else recorded,
                    alive=pid is not None,
                    ready=self.is_ready(name) if pid is not None else False,
                    address=svc.address(),
                    note=note,
                )
            )
        return rows

    def logs(self, name: str, lines: int = 50) -> str:
        if name != "migrate" and name != "provision":
            self.service(name)
        return tail(self.layout.log(name), lines)

    def redis_flushall(self) -> None:
        """FLUSHALL on the real redis port (bypasses toxiproxy)."""
        import redis

        from .layout import HOST, REDIS_PORT

        client = redis.Redis(host=HOST, port=REDIS_PORT, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()
