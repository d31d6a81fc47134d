"""What the console refuses: :class:`ConsoleError`, shown as its error page. Its own module so
that the pages of :mod:`.routes` and of :mod:`.schedules` raise the same one."""

from __future__ import annotations


class ConsoleError(Exception):
    """A request the console refuses, shown as a page with this status and message."""

    def __init__(
        self, status: int, title: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message
        self.headers = headers or {}
