"""The example shop's mail service guards, as SHOP_MAIL_GUARD and a scenario's mail_guard
name them."""

from __future__ import annotations

import pytest

from examples.shop.guard import MailGuard


def test_a_guard_is_named_or_refused_with_the_choices():
    assert str(MailGuard.parse(None)) == "key,fence"
    assert str(MailGuard.parse(" fence ")) == "fence"
    assert str(MailGuard.parse("none")) == "none"
    with pytest.raises(ValueError, match="comma list of key, fence, or none"):
        MailGuard.parse("fence,idempotency")
