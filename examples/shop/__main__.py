"""``python -m examples.shop``: the shop (``SHOP_ADDR``, default 127.0.0.1:8090) and its mail
service (``SHOP_MAIL_ADDR``, default 127.0.0.1:8025) in one Trio nursery, on the Postgres of
``LEASEWORK_POSTGRES_DSN``. Applies ``schema.sql`` first. ``SHOP_MAIL_GUARD`` picks the mail
service's guards (:class:`examples.shop.mail.MailGuard`). SIGTERM or Ctrl-C stops both."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psycopg
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from psycopg_pool import ConnectionPool

from examples.shop import mail, web
from leasework import downstream

DSN = os.environ.get(
    "LEASEWORK_POSTGRES_DSN", "postgresql://leasework:leasework@127.0.0.1:15432/leasework"
)


def apply_schema(dsn: str, timeout: float = 60.0) -> None:
    """Create the shop's tables if they are missing, waiting for Postgres (blocking)."""
    schema = (Path(__file__).parent / "schema.sql").read_text()
    until = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(schema)
                downstream.install(conn)  # the mail service's fence table
            return
        except psycopg.OperationalError as exc:
            if time.monotonic() > until:
                raise SystemExit(
                    f"shop: cannot reach Postgres at LEASEWORK_POSTGRES_DSN: {exc}"
                ) from None
            time.sleep(1.0)


def config(addr: str) -> Config:
    cfg = Config()
    cfg.bind = [addr]
    cfg.accesslog = None
    cfg.graceful_timeout = 2.0
    # a connection may wait this long for its request, as behind a slow network or proxy
    # (nginx keeps 75 s; hypercorn's 5 s would drop a call that is merely late, and the chaos
    # scenario t-shop-mail-fence delivers worker-1's calls half a minute late on purpose)
    cfg.keep_alive_timeout = 75.0
    return cfg


async def main() -> None:
    try:
        guard = mail.MailGuard.from_env()
    except ValueError as exc:
        raise SystemExit(f"shop: {exc}") from None
    await trio.to_thread.run_sync(apply_schema, DSN)
    # check each connection before use: a connection the database dropped (a restart, a
    # network blip) is replaced instead of failing the next order
    pool = ConnectionPool(
        DSN,
        min_size=1,
        max_size=8,
        open=False,
        timeout=10.0,
        check=ConnectionPool.check_connection,
        # keep reconnecting while the database is away (psycopg_pool's default gives up after
        # five minutes, and a pool that gave up answers every order "unreachable")
        reconnect_timeout=3600.0,
    )
    await trio.to_thread.run_sync(lambda: pool.open(wait=False))
    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        stop.set()
                        return

            nursery.start_soon(watch)
            for app, addr in (
                (web.create_app(pool), os.environ.get("SHOP_ADDR", "127.0.0.1:8090")),
                (mail.create_app(pool, guard), os.environ.get("SHOP_MAIL_ADDR", "127.0.0.1:8025")),
            ):
                nursery.start_soon(
                    lambda a=app, c=config(addr): serve(a, c, shutdown_trigger=stop.wait)
                )
            print(f"shop: serving; the mail service's guard: {guard}", file=sys.stderr, flush=True)
            await stop.wait()
    finally:
        await trio.to_thread.run_sync(lambda: pool.close(timeout=5.0))


if __name__ == "__main__":
    trio.run(main)
