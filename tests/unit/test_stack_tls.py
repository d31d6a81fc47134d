"""The stack's throwaway CA made with the real openssl: the services' parallel starts on a
fresh machine all call :func:`devstack.tls.ensure` at once, and must end with one key per
certificate (two makers at once once left Postgres a key that did not match its
certificate, and it refused to start)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

from devstack import tls
from devstack.layout import Layout


def public_key(args: list[str], path) -> bytes:
    return subprocess.run(
        ["openssl", *args, "-in", str(path)], capture_output=True, check=True
    ).stdout


def test_parallel_ensures_make_one_matching_set(tmp_path):
    layout = Layout(tmp_path / "state", tmp_path / "cache", tmp_path)
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda _: tls.ensure(layout), range(4)))
    paths = made[0]
    assert all(m == paths for m in made)
    for name in ("server", "client"):
        cert_key = public_key(["x509", "-noout", "-pubkey"], paths[f"{name}.pem"])
        own_key = public_key(["pkey", "-pubout"], paths[f"{name}.key"])
        assert cert_key == own_key, f"{name}.pem is not the certificate of {name}.key"
    subprocess.run(
        ["openssl", "verify", "-CAfile", str(paths["ca.pem"]), str(paths["server.pem"])],
        check=True,
        capture_output=True,
    )
