"""The body of ``PUT /queues/{name}/concurrency`` (leasework/api/queues.py), as its schema says."""

from __future__ import annotations

import pytest

from leasework.api.queues import concurrency_body


@pytest.mark.parametrize(("sent", "cap"), [(5, 5), (5.0, 5), (19636757.0, 19636757), (None, None)])
def test_a_whole_number_or_null_is_a_cap(sent, cap):
    # found by schemathesis: 19636757.0 is an integer to JSON Schema, and was refused
    assert concurrency_body({"concurrency": sent}) == cap


@pytest.mark.parametrize("sent", [0, -1, 2.5, True, "5", [5]])
def test_anything_else_is_refused(sent):
    with pytest.raises(Exception, match="fix these fields|whole number"):
        concurrency_body({"concurrency": sent})
