"""The stack's throwaway certificate authority and the secured listeners' credentials.

Every stack has secured listeners beside its plain ones (Kafka ``SECURE``: SASL_SSL with SCRAM
and PLAIN users; Redis ``tls-port`` with an ACL user; Postgres ``ssl=on``), and they need a
CA, a server certificate for 127.0.0.1 and localhost, and a client certificate. They are made
once with ``openssl`` under ``<state>/tls/`` and made again when a file is missing or a
certificate expires within a week:

    ca.key ca.pem              the throwaway CA (never leaves the machine)
    server.key server.pem      127.0.0.1 and localhost, signed by the CA (PKCS#8 key)
    server-bundle.pem          key and certificate in one file: Kafka's PEM keystore
    client.key client.pem      CN=leasework, for a client-certificate login

``just up --secure`` makes leasework's own processes use only the secured listeners
(:func:`secure_env`); ``just up --plain`` goes back. The plain listeners stay for the
harness's own admin calls and fault injection.
"""

from __future__ import annotations

import fcntl
import subprocess
import threading
from pathlib import Path

from . import procs, tools
from .errors import StackError
from .layout import (
    HOST,
    KAFKA_SECURE_BROKERS,
    KAFKA_SECURE_PASSWORD,
    KAFKA_SECURE_USER,
    PG_DATABASE,
    PG_PASSWORD,
    PG_USER,
    POSTGRES_PROXY_PORT,
    REDIS_ACL_PASSWORD,
    REDIS_ACL_USER,
    REDIS_TLS_PROXY_PORT,
    Layout,
)

DAYS = 825
RENEW_WITHIN_SECONDS = 7 * 86400
SERVER_NAMES = f"subjectAltName=IP:{HOST},DNS:localhost"


def files(layout: Layout) -> dict[str, Path]:
    d = layout.tls_dir
    names = ("ca.key", "ca.pem", "server.key", "server.pem", "server-bundle.pem")
    return {name: d / name for name in (*names, "client.key", "client.pem")}


def _openssl(args: list[str], log: Path) -> None:
    rc = procs.run_logged([str(tools.require("openssl")), *args], log, "tls")
    if rc != 0:
        raise StackError(f"tls: openssl {args[0]} failed (exit {rc})", log)


def _valid(cert: Path) -> bool:
    if not cert.exists():
        return False
    checked = subprocess.run(
        [str(tools.require("openssl")), "x509", "-checkend", str(RENEW_WITHIN_SECONDS)],
        input=cert.read_bytes(),
        capture_output=True,
        check=False,
    )
    return checked.returncode == 0


_making = threading.Lock()


def ensure(layout: Layout) -> dict[str, Path]:
    """The CA and certificates, made (again) when missing or about to expire. Idempotent,
    and safe to call at once from the services' parallel starts and from several processes:
    one caller makes them, the others wait and find them made (two makers at once wrote a
    server key and a certificate of another key, and Postgres refused to start)."""
    layout.tls_dir.mkdir(parents=True, exist_ok=True)
    with _making, open(layout.tls_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(layout)


def _ensure(layout: Layout) -> dict[str, Path]:
    paths = files(layout)
    if all(p.exists() for p in paths.values()) and all(
        _valid(paths[c]) for c in ("ca.pem", "server.pem", "client.pem")
    ):
        return paths
    layout.tls_dir.chmod(0o755)
    log = layout.log("tls")
    log.parent.mkdir(parents=True, exist_ok=True)
    ca_key, ca = paths["ca.key"], paths["ca.pem"]
    _openssl(
        ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(ca_key)],
        log,
    )
    _openssl(
        [
            "req",
            "-x509",
            "-new",
            "-key",
            str(ca_key),
            "-days",
            str(DAYS),
            "-subj",
            "/CN=leasework throwaway stack CA",
            "-out",
            str(ca),
        ],
        log,
    )
    for name, subject, extension in (
        ("server", f"/CN={HOST}", SERVER_NAMES),
        ("client", "/CN=leasework", "extendedKeyUsage=clientAuth"),
    ):
        key, cert, csr = paths[f"{name}.key"], paths[f"{name}.pem"], layout.tls_dir / "req.csr"
        _openssl(
            ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key)],
            log,
        )
        _openssl(["req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr)], log)
        ext = layout.tls_dir / f"{name}.ext"
        ext.write_text(extension + "\n")
        _openssl(
            [
                "x509",
                "-req",
                "-in",
                str(csr),
                "-CA",
                str(ca),
                "-CAkey",
                str(ca_key),
                "-CAcreateserial",
                "-days",
                str(DAYS),
                "-extfile",
                str(ext),
                "-out",
                str(cert),
            ],
            log,
        )
        csr.unlink(missing_ok=True)
    paths["server-bundle.pem"].write_text(
        paths["server.key"].read_text() + paths["server.pem"].read_text()
    )
    for key in ("ca.key", "server.key", "client.key", "server-bundle.pem"):
        paths[key].chmod(0o600)
    return paths


def secure_env(tls_dir: Path, kafka_brokers: str = KAFKA_SECURE_BROKERS) -> dict[str, str]:
    """What points a leasework process at the secured listeners only (pure): Postgres with
    ``sslmode=verify-full`` against the stack's CA, Redis over TLS as the ACL user, Kafka over
    SASL_SSL with SCRAM-SHA-512."""
    ca = str(tls_dir / "ca.pem")
    return {
        "LEASEWORK_POSTGRES_DSN": (
            f"postgresql://{PG_USER}:{PG_PASSWORD}@{HOST}:{POSTGRES_PROXY_PORT}/{PG_DATABASE}"
            f"?sslmode=verify-full&sslrootcert={ca}"
        ),
        "LEASEWORK_REDIS_URL": (
            f"rediss://{REDIS_ACL_USER}:{REDIS_ACL_PASSWORD}@{HOST}:{REDIS_TLS_PROXY_PORT}/0"
        ),
        "LEASEWORK_REDIS_CA": ca,
        "LEASEWORK_KAFKA_BROKERS": kafka_brokers,
        "LEASEWORK_RDKAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "LEASEWORK_RDKAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "LEASEWORK_RDKAFKA_SASL_USERNAME": KAFKA_SECURE_USER,
        "LEASEWORK_RDKAFKA_SASL_PASSWORD": KAFKA_SECURE_PASSWORD,
        "LEASEWORK_RDKAFKA_SSL_CA_LOCATION": ca,
    }
