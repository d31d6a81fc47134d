"""The operator console at ``/ui``, served by the api: server-rendered pages, one stylesheet,
no script and no build step (:mod:`.routes`; the recurring schedules' pages and actions in
:mod:`.schedules`); the session, CSRF and login checks
(:mod:`.session`), the jobs page's filters (:mod:`.filters`), the overview's Prometheus
queries (:mod:`.prometheus`) and its charts (:mod:`.charts`) are pure and unit-tested."""

from leasework.api.console.routes import add_console_routes

__all__ = ["add_console_routes"]
