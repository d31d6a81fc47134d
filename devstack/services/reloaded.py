"""What Prometheus and Alertmanager share: a config devstack generates into the service's
state dir, checks with the server's own tool before it replaces the old one, and has a
running server reload (``POST /-/reload``) when it changed; readiness is ``GET /-/ready``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from .. import tools
from ..errors import StackError
from ..layout import Layout
from .base import Service


class ReloadedService(Service):
    """Subclasses set ``name``, ``url``, ``config_name`` and ``check`` (the checking tool's
    binary and arguments, the candidate file's path appended) and implement :meth:`render`,
    :meth:`command` and :meth:`markers`."""

    url: str = ""
    config_name: str = ""
    check: tuple[str, ...] = ()

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self._config_changed = False

    @property
    def base_dir(self) -> Path:
        return self.layout.service_dir(self.name)

    @property
    def config(self) -> Path:
        return self.base_dir / self.config_name

    def address(self) -> str:
        return self.url

    def render(self) -> str:
        """The config file's text."""
        raise NotImplementedError

    def prepare(self) -> None:
        (self.base_dir / "data").mkdir(parents=True, exist_ok=True)
        text = self.render()
        old = self.config.read_text() if self.config.exists() else None
        self._config_changed = old != text
        candidate = self.config.with_suffix(".yml.new")
        candidate.write_text(text)
        tool, *args = self.check
        result = subprocess.run(
            [str(tools.require(tool)), *args, str(candidate)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise StackError(
                f"{self.name}: {tool} rejected the generated config {candidate}:\n"
                + (result.stdout + result.stderr).strip()
            )
        candidate.replace(self.config)

    def probe(self) -> bool:
        return httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200

    def after_ready(self, fresh: bool) -> None:
        if fresh:
            return
        self.prepare()  # regenerate (new rule files, a new port contract) for the running server
        if self._config_changed:
            r = httpx.post(f"{self.url}/-/reload", timeout=10.0)
            if not r.is_success:
                raise StackError(f"{self.name}: /-/reload -> {r.status_code} {r.text.strip()}")
