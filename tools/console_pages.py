"""The console's pages end to end on a big database: an api of its own on ``dsn``, a session
logged in through the real login form, then each page fetched over HTTP ``runs`` times
(median, min, max). Used by ``python -m tools.console_timing --pages``; the query timings
say what the database costs, these what an operator waits for (rendering, the Prometheus
asks of the overview, the guard and the rate limit included)."""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
from psycopg.rows import dict_row

from leasework.store import operators

PAGES = [
    ("console overview (/ui/)", "/ui/"),
    ("console jobs, type=fail", "/ui/jobs?type=fail"),
    ("console jobs, status=dead type=ledger", "/ui/jobs?status=dead&type=ledger"),
    ("console jobs, no filter", "/ui/jobs"),
    ("GET /jobs?type=fail&limit=50", "/jobs?type=fail&limit=50"),
]


@dataclass(frozen=True)
class PageTiming:
    name: str
    path: str
    status: int
    median_ms: float
    min_ms: float
    max_ms: float


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _token(dsn: str) -> str:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        token, _ = operators.token_create(
            conn,
            name=f"console-pages-{os.getpid()}-{int(time.time())}",
            scopes=frozenset({"admin"}),
            rate=None,
            burst=None,
            created_by="tools/console_pages.py",
        )
    return token


def _login(http: httpx.Client, url: str, token: str) -> None:
    page = http.get("/ui/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    if nonce is None:
        raise RuntimeError(f"no login form at {url}/ui/login: {page.status_code}")
    answer = http.post(
        "/ui/login",
        data={"token": token, "nonce": nonce.group(1), "next": "/ui/"},
        headers={"Origin": url},
    )
    if answer.status_code != 303:
        raise RuntimeError(f"login refused: {answer.status_code} {answer.text[:200]}")


def time_pages(dsn: str, runs: int, log: Path) -> list[PageTiming]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LEASEWORK_POSTGRES_DSN": dsn,
        "LEASEWORK_OPS_ADDR": f"127.0.0.1:{port}",
        "LEASEWORK_PROCESS_NAME": "console-pages-api",
        "LEASEWORK_APP": os.environ.get("LEASEWORK_APP", "leasework.demo:app"),
    }
    token = _token(dsn)
    with log.open("ab") as out:
        api = subprocess.Popen(
            [sys.executable, "-m", "leasework", "api"], env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or api.poll() is not None:
                raise RuntimeError(f"the api for the page timings did not start; see {log}")
            time.sleep(0.3)
        timings = []
        with httpx.Client(base_url=url, timeout=60) as http:
            _login(http, url, token)
            for name, path in PAGES:
                headers = {"Authorization": f"Bearer {token}"} if not path.startswith("/ui") else {}
                status = http.get(path, headers=headers).status_code  # warm-up
                seconds = []
                for _ in range(runs):
                    started = time.perf_counter()
                    status = http.get(path, headers=headers).status_code
                    seconds.append((time.perf_counter() - started) * 1000)
                timings.append(
                    PageTiming(
                        name, path, status, statistics.median(seconds), min(seconds), max(seconds)
                    )
                )
        return timings
    finally:
        api.terminate()
        api.wait(timeout=30)


def table(timings: list[PageTiming]) -> list[str]:
    lines = [
        "| page | status | median ms | min ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(
            f"| {t.name} | {t.status} | {t.median_ms:.1f} | {t.min_ms:.1f} | {t.max_ms:.1f} |"
        )
    return lines
