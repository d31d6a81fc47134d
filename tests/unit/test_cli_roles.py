"""A role whose address is taken says so and what to do, before it starts anything."""

import socket

from leasework.cli import address_taken


def test_a_taken_address_is_named_with_what_to_do():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        said = address_taken(("127.0.0.1", port))
    assert said is not None and f"127.0.0.1:{port} is already in use" in said
    assert "just up-infra" in said and "LEASEWORK_OPS_ADDR" in said


def test_a_free_address_or_none_is_not_taken():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
    assert address_taken(("127.0.0.1", port)) is None
    assert address_taken(None) is None
