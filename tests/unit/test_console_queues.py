"""The console's queue cap form (pure): what its field sets."""

from __future__ import annotations

import pytest

from leasework.api.console.queues import parse_cap


@pytest.mark.parametrize(("raw", "cap"), [("3", 3), (" 12 ", 12), ("", None), ("none", None)])
def test_a_whole_number_caps_and_empty_lifts(raw, cap):
    assert parse_cap(raw) == cap


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "two", "9999999999"])
def test_anything_else_says_what_a_cap_is(raw):
    assert "a whole number of at least 1, or empty for no cap" in parse_cap(raw)
