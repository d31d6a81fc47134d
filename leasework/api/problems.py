"""RFC 9457 problem details: every error the API returns says what went wrong and what to do."""

from __future__ import annotations

from typing import Any

from quart import Response, json

PROBLEM_TYPE_BASE = "https://leasework.dev/problems/"


class Problem(Exception):
    def __init__(self, status: int, slug: str, title: str, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.extensions = extensions

    def body(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": PROBLEM_TYPE_BASE + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        body.update(self.extensions)
        return body

    def response(self, instance: str | None = None) -> Response:
        return Response(
            json.dumps(self.body(instance)),
            status=self.status,
            content_type="application/problem+json",
        )
