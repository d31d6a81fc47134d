"""The roles' start-up checks against the real stack: a real ``python -m leasework ROLE`` on a
free port, with the stack's environment (devstack's ``app_env``, plain mode) and one
deliberately wrong setting that harms no one else (its own Postgres connections only). It
refuses to start and says why; with the override it starts, logs it, and ``/readyz``, the
metric and the console show it; a dependency unreachable at start does not stop it, and its
checks run once it answers."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack import layout
from devstack.services.apps import app_env
from tests.integration.conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
SYNC_OFF = "options=-c%20synchronous_commit%3Doff"
SYNC_OFF_DSN = f"{layout.POSTGRES_DSN}?{SYNC_OFF}"
# the same server's maintenance database: leasework's migrations never ran there
UNMIGRATED_DSN = layout.POSTGRES_DSN.rsplit("/", 1)[0] + "/postgres"
EXIT_TIMEOUT = 30.0  # the checks' own budget (12 s) and the interpreter's start, generously
READY_TIMEOUT = 30.0


class Role:
    """One leasework process started for a test; its stderr (JSON logs, and what a refused
    start prints) goes to a file."""

    def __init__(self, role: str, extra: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        name = f"preflight-test-{role}-{self.port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("LEASEWORK_")}
        env = app_env(name, f"127.0.0.1:{self.port}", base, extra)
        if role == "worker":  # never in the stack's group: it must not take the stack's jobs
            env["LEASEWORK_CONSUMER_GROUP"] = f"preflight-test-{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "leasework", role],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text()

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.output().splitlines() if line.startswith("{")]

    def wait_exit(self, timeout: float = EXIT_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {timeout:g}s; output:\n{self.output()}")

    def readyz(self) -> httpx.Response | None:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2)
        except httpx.TransportError:
            return None

    def wait_ready(self) -> dict:
        def ready():
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode}; output:\n{self.output()}")
            response = self.readyz()
            return response is not None and response.status_code == 200 and response.json()

        return wait_for(ready, READY_TIMEOUT, f"{self.url}/readyz 200")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def start(stack, tmp_path) -> Iterator:
    started: list[Role] = []

    def start(role: str, **extra: str) -> Role:
        process = Role(role, extra, tmp_path / f"{role}-{len(started)}.log")
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def assert_refused(process: Role, check: str, found: str) -> str:
    assert process.wait_exit() == 1, process.output()
    out = process.output()
    assert f"[FAIL] {check}: {found}" in out
    assert re.search(r"why: \S", out) and re.search(r"fix: \S", out)
    assert "refusing to start" in out and f"LEASEWORK_DOCTOR_ALLOW={check}" in out
    logged = [r for r in process.records() if r.get("check") == check]
    assert logged and logged[0]["level"] == "error" and logged[0]["found"] == found
    assert not any(r["msg"] == "serving" for r in process.records())  # it never served
    return out


def test_the_stack_passes_every_start_up_check(start):
    process = start("relay")
    body = process.wait_ready()
    assert "overridden" not in body
    done = next(r for r in process.records() if r["msg"] == "start-up checks done")
    assert done["overridden"] == [] and done["deferred"] == []
    assert done["seconds"] < 1.0  # the three dependencies checked at once
    assert not [
        r
        for r in process.records()
        if r["logger"] == "leasework.preflight" and r["level"] != "info"
    ]


@pytest.mark.parametrize("role", ["relay", "worker", "api"])
def test_synchronous_commit_off_refuses_to_start(start, role):
    process = start(role, LEASEWORK_POSTGRES_DSN=SYNC_OFF_DSN)
    out = assert_refused(process, "postgres.synchronous_commit", "synchronous_commit=off")
    assert "crash loses accepted jobs" in out


def test_an_unmigrated_database_refuses_to_start(start):
    process = start("relay", LEASEWORK_POSTGRES_DSN=UNMIGRATED_DSN)
    out = assert_refused(
        process,
        "postgres.migrations",
        "no schema_migrations table: the database was never migrated",
    )
    # no live token there either: reported, but it refuses nothing (the api just says 401)
    assert "(postgres.migrations)" in out and "LEASEWORK_DOCTOR_ALLOW=postgres.migrations " in out
    assert any(
        r.get("check") == "postgres.tokens" and r["level"] == "warning" for r in process.records()
    )


def test_the_override_starts_logs_and_shows_it(start):
    process = start(
        "relay",
        LEASEWORK_POSTGRES_DSN=SYNC_OFF_DSN,
        LEASEWORK_DOCTOR_ALLOW="postgres.synchronous_commit",
    )
    body = process.wait_ready()
    assert body["status"] == "ready"
    assert body["overridden"] == [
        {"check": "postgres.synchronous_commit", "found": "synchronous_commit=off"}
    ]
    warning = next(r for r in process.records() if "OVERRIDDEN" in r["msg"])
    assert warning["level"] == "warning" and warning["check"] == "postgres.synchronous_commit"
    assert "LEASEWORK_DOCTOR_ALLOW" in warning["msg"] and warning["why"] and warning["fix"]
    metrics = httpx.get(f"{process.url}/metrics", timeout=5).text
    assert 'leasework_doctor_overridden{check="postgres.synchronous_commit"} 1.0' in metrics


def login(client: httpx.Client, token: str) -> None:
    page = client.get("/ui/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    assert nonce, page.text
    response = client.post(
        "/ui/login",
        data={"token": token, "nonce": nonce.group(1)},
        headers={"Origin": str(client.base_url).rstrip("/")},
    )
    assert response.status_code in (302, 303), response.text


def test_the_console_overview_shows_the_override(start, make_token):
    process = start(
        "api",
        LEASEWORK_POSTGRES_DSN=SYNC_OFF_DSN,
        LEASEWORK_DOCTOR_ALLOW="postgres.synchronous_commit",
    )
    body = process.wait_ready()
    assert body["overridden"] == [{"check": "postgres.synchronous_commit"}]  # public port
    _, token = make_token("read")
    with httpx.Client(base_url=process.url, timeout=10) as client:
        login(client, token)
        page = client.get("/ui")
    assert page.status_code == 200
    banner = re.search(r'<p class="warning" id="doctor-overridden".*?</p>', page.text, re.S)
    assert banner, page.text[:3000]
    assert "postgres.synchronous_commit" in banner.group(0)
    assert "synchronous_commit=off" in banner.group(0)


class Forwarder:
    """A TCP port that forwards to ``target`` once :meth:`open` is called: a dependency that
    is down at a process's start and comes up later."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port, self.target = port, target
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []

    def _thread(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def open(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port))
        self.sockets.append(server)
        self._thread(self._accept, server)

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            self._thread(self._pipe, client, upstream)
            self._thread(self._pipe, upstream, client)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for thread in self.threads:
            thread.join(5)


def test_unreachable_at_start_starts_and_its_checks_run_once_it_answers(start):
    port = free_port()
    forwarder = Forwarder(port, ("127.0.0.1", layout.POSTGRES_PORT))
    dsn = (
        f"postgresql://{layout.PG_USER}:{layout.PG_PASSWORD}@127.0.0.1:{port}/"
        f"{layout.PG_DATABASE}?{SYNC_OFF}"
    )
    process = start("relay", LEASEWORK_POSTGRES_DSN=dsn)
    try:
        # down at start: not a refusal; it serves, and /readyz names the dependency
        def unready_on_postgres():
            if process.proc.poll() is not None:
                pytest.fail(f"exited {process.proc.returncode}; output:\n{process.output()}")
            response = process.readyz()
            return response is not None and "postgres" in response.json().get("unavailable", {})

        wait_for(unready_on_postgres, READY_TIMEOUT, "/readyz naming postgres")
        deferred = next(r for r in process.records() if r["msg"] == "start-up checks done")
        assert deferred["deferred"] == ["postgres"]
        # Postgres answers now: its checks run and find synchronous_commit off
        forwarder.open()
        assert process.wait_exit() == 1, process.output()
    finally:
        forwarder.close()
    out = process.output()
    assert "[FAIL] postgres.synchronous_commit: synchronous_commit=off" in out
    assert "stopping: 1 start-up check(s)" in out
    assert "LEASEWORK_DOCTOR_ALLOW=postgres.synchronous_commit" in out
    assert any(r["msg"] == "drained" for r in process.records())  # drained, not killed
