"""The mail service's guards (``SHOP_MAIL_GUARD``), apart from the service so that the chaos
harness can check a scenario's choice without importing a web framework."""

from __future__ import annotations

import os
from dataclasses import dataclass

GUARDS = ("key", "fence")


@dataclass(frozen=True)
class MailGuard:
    """Which of the two guards the service applies."""

    key: bool = True
    fence: bool = True

    @classmethod
    def parse(cls, text: str | None) -> MailGuard:
        """``key,fence`` (the default), ``key``, ``fence`` or ``none``; raises ValueError
        naming the choices for anything else."""
        words = {w.strip() for w in (text or "key,fence").split(",") if w.strip()}
        if words == {"none"}:
            return cls(key=False, fence=False)
        unknown = sorted(words - set(GUARDS))
        if unknown or not words:
            raise ValueError(
                f"SHOP_MAIL_GUARD={text!r}: give a comma list of {', '.join(GUARDS)}, or none"
            )
        return cls(key="key" in words, fence="fence" in words)

    @classmethod
    def from_env(cls) -> MailGuard:
        return cls.parse(os.environ.get("SHOP_MAIL_GUARD"))

    def __str__(self) -> str:
        return ",".join(g for g in GUARDS if getattr(self, g)) or "none"
