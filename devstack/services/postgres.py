"""PostgreSQL: one postmaster on 127.0.0.1:15433, reached by leasework through toxiproxy.

Postgres refuses to run as root. We run it as the Debian ``postgres`` system user,
which the ``postgresql`` package creates (no extra user management): the data dir
``<state>/postgres/data`` and the socket dir ``<state>/postgres`` are owned by it.
When the supervisor itself is not root, postgres simply runs as the current user.

The postmaster is started directly (not via pg_ctl) so the recorded pid is the
postmaster itself. initdb names the bootstrap superuser ``leasework`` (password
``leasework``); local socket auth is ``trust``, TCP auth is ``scram-sha-256``, so the
DSN ``postgresql://leasework:leasework@127.0.0.1:15432/leasework`` works through the proxy.
Stop is SIGINT (postgres "fast" shutdown: SIGTERM would wait for clients to leave).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

from .. import procs, tls, tools
from ..errors import StackError
from ..layout import (
    HOST,
    PG_DATABASE,
    PG_PASSWORD,
    PG_USER,
    POSTGRES_PORT,
    POSTGRES_PROXY_PORT,
    addr,
)
from .base import Service

OS_USER = "postgres"

SETTINGS: dict[str, str] = {
    "port": str(POSTGRES_PORT),
    "listen_addresses": HOST,
    "max_connections": "200",
    "shared_buffers": "128MB",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "logging_collector": "off",
    "log_destination": "stderr",
    "log_line_prefix": "%m [%p] %q%u@%d ",
    "log_min_messages": "warning",
    "log_connections": "off",
    "huge_pages": "off",
}


def postgres_args(data_dir: Path, socket_dir: Path) -> list[str]:
    """Arguments after the ``postgres`` binary (pure; unit-tested). TLS is on, with the
    certificate and key :meth:`Postgres.prepare` copies next to the data dir (``sslmode=
    verify-full`` against the stack's CA); a client may still connect without it, as the
    harness does."""
    args = ["-D", str(data_dir)]
    settings = dict(
        SETTINGS,
        unix_socket_directories=str(socket_dir),
        ssl="on",
        ssl_cert_file=str(socket_dir / "server.pem"),
        ssl_key_file=str(socket_dir / "server.key"),
        ssl_ca_file=str(socket_dir / "ca.pem"),
    )
    for key, value in settings.items():
        args += ["-c", f"{key}={value}"]
    return args


def connect_kwargs(dbname: str, timeout: int = 2) -> dict[str, object]:
    return {
        "host": HOST,
        "port": POSTGRES_PORT,
        "user": PG_USER,
        "password": PG_PASSWORD,
        "dbname": dbname,
        "connect_timeout": timeout,
    }


def untraversable_parent(path: Path, user: pwd.struct_passwd) -> Path | None:
    """First directory on the way to ``path`` that ``user`` may not enter, if any."""
    for d in [*reversed(path.parents), path]:
        try:
            st = d.stat()
        except FileNotFoundError:
            return None  # we create the rest ourselves (as root, mode 0755)
        if st.st_uid == user.pw_uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == user.pw_gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            return d
    return None


class Postgres(Service):
    name = "postgres"
    stop_signal = signal.SIGINT
    ready_timeout = 60.0
    init_script = "postgresql"

    @property
    def base_dir(self) -> Path:
        return self.layout.service_dir("postgres")

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    def ports(self) -> tuple[int, ...]:
        return (POSTGRES_PORT,)

    def address(self) -> str:
        return f"{addr(POSTGRES_PORT)} (proxy {addr(POSTGRES_PROXY_PORT)})"

    def markers(self) -> tuple[str, ...]:
        return ("postgres", "-D", str(self.data_dir))

    def cwd(self) -> Path:
        return self.base_dir

    def strays(self) -> list[int]:
        # Backends and auxiliary processes call setsid() and chdir to the data dir.
        return procs.pids_with_cwd(self.data_dir) if self.data_dir.exists() else []

    def run_as(self) -> str | None:
        return OS_USER if os.geteuid() == 0 else None

    def _chown(self, path: Path) -> None:
        user = self.run_as()
        if user is not None:
            pw = pwd.getpwnam(user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def prepare(self) -> None:
        user = self.run_as()
        if user is not None:
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise StackError(
                    f"postgres: OS user {user!r} does not exist (it comes with the Debian "
                    "postgresql package); run `python -m devstack provision`"
                ) from None
            blocked = untraversable_parent(self.base_dir.parent, pwd.getpwnam(user))
            if blocked is not None:
                raise StackError(
                    f"postgres: user {user!r} cannot traverse {blocked}; choose a "
                    "LEASEWORK_STATE_DIR outside it (default /var/tmp/leasework)"
                )
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir.chmod(0o700)
        self._chown(self.base_dir)
        self._copy_tls()
        if (self.data_dir / "PG_VERSION").exists():
            self._drop_stale_lockfiles()
            return
        # No PG_VERSION: never initialised, or an interrupted initdb. Start over.
        shutil.rmtree(self.data_dir, ignore_errors=True)
        pwfile = self.base_dir / "initdb.pw"
        pwfile.write_text(PG_PASSWORD + "\n")
        self._chown(pwfile)
        log = self.layout.log(self.name)
        argv = [
            str(tools.require("initdb")),
            "-D",
            str(self.data_dir),
            "-U",
            PG_USER,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--no-locale",
        ]
        extra: dict[str, object] = {}
        if user is not None:
            extra = {"user": user, "group": user, "extra_groups": []}
        with log.open("ab") as out:
            out.write(f"\n=== devstack initdb: {' '.join(argv)}\n".encode())
            out.flush()
            rc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                check=False,
                **extra,  # type: ignore[arg-type]
            ).returncode
        pwfile.unlink(missing_ok=True)
        if rc != 0:
            raise StackError(f"postgres: initdb failed (exit {rc})", log)

    def _copy_tls(self) -> None:
        """The server's certificate and key where postgres may read them: owned by the user
        it runs as, the key mode 0600 (postgres refuses a key others can read)."""
        made = tls.ensure(self.layout)
        for name in ("server.pem", "server.key", "ca.pem"):
            target = self.base_dir / name
            target.write_bytes(made[name].read_bytes())
            target.chmod(0o600 if name.endswith(".key") else 0o644)
            self._chown(target)

    def stale(self, pid: int) -> list[str]:
        info = procs.read_proc(pid)
        if info is None or list(info.cmdline[1:]) == self.command()[1:]:
            return []
        return ["command line (settings)"]

    def _drop_stale_lockfiles(self) -> None:
        """After a crash (chaos SIGKILL) postmaster.pid and the socket lock name a dead
        pid, which may linger as a zombie until init reaps it; postgres would then refuse
        to start. We only start postgres when no process of ours is running, so a lock
        file whose pid is not a live process is stale."""
        for lockfile in (
            self.data_dir / "postmaster.pid",
            self.base_dir / f".s.PGSQL.{POSTGRES_PORT}.lock",
        ):
            try:
                first = lockfile.read_text().splitlines()[0].strip()
            except (FileNotFoundError, IndexError):
                continue
            pid = int(first) if first.isdigit() else None
            if pid is None or not procs.is_alive(pid):
                lockfile.unlink(missing_ok=True)

    def command(self) -> list[str]:
        return [str(tools.require("postgres")), *postgres_args(self.data_dir, self.base_dir)]

    def probe(self) -> bool:
        import psycopg

        with psycopg.connect(**connect_kwargs("postgres")) as conn:  # type: ignore[arg-type]
            conn.execute("SELECT 1")
        return True

    def after_ready(self, fresh: bool) -> None:
        import psycopg

        with psycopg.connect(autocommit=True, **connect_kwargs("postgres")) as conn:  # type: ignore[arg-type]
            row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,))
            if row.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{PG_DATABASE}" OWNER "{PG_USER}"')
