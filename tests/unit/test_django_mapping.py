"""How Django's task vocabulary maps onto leasework's (leasework.django.mapping)."""

from __future__ import annotations

import pytest

from leasework.django.mapping import (
    DJANGO_STATUS,
    NOT_RAISED_CLASS,
    RAISED,
    RAISED_PERMANENT,
    arguments_of,
    error_parts,
    leasework_priority,
    payload_of,
    raised_text,
)
from leasework.states import Status


@pytest.mark.parametrize(
    ("django", "band"),
    [(100, 0), (1, 0), (0, 0), (-1, 1), (-33, 1), (-34, 2), (-66, 2), (-67, 3), (-100, 3)],
)
def test_django_priorities_fall_into_leaseworks_four_bands_the_default_at_the_top(django, band):
    assert leasework_priority(django) == band


def test_every_leasework_status_has_a_django_state():
    assert set(DJANGO_STATUS) == {str(s) for s in Status}
    assert DJANGO_STATUS["failed"] == "READY"  # waiting for its retry: ready to run again
    assert DJANGO_STATUS["cancelled"] == "FAILED"


def test_arguments_go_through_the_payload_and_back():
    assert arguments_of(payload_of((1, "a"), {"b": [2]})) == ([1, "a"], {"b": [2]})
    assert arguments_of({}) == ([], {})
    for bad in ([1], {"args": "x"}, {"kwargs": [1]}):
        with pytest.raises(ValueError, match="payload|kwargs"):
            arguments_of(bad)


def test_a_raised_error_gives_back_its_class_path_and_traceback_and_another_ending_its_text():
    stored = RAISED + raised_text("shop.PaymentDeclined", "card: refused", "Traceback ...\nX")
    assert error_parts(stored) == ("shop.PaymentDeclined", "Traceback ...\nX")
    permanent = stored.replace(RAISED, RAISED_PERMANENT)
    assert error_parts(permanent) == ("shop.PaymentDeclined", "Traceback ...\nX")
    assert error_parts("timed out after 30s") == (NOT_RAISED_CLASS, "timed out after 30s")
