"""Read counters straight from the processes' /metrics endpoints (no Prometheus needed)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int, timeout: float = 5.0) -> dict[str, float]:
    """Every sample of one process as ``name{labels}`` -> value (labels sorted)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=timeout).text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def total(port: int, name: str) -> float:
    """Sum of every sample named ``name`` (any labels) on one process; 0 if unreachable."""
    try:
        samples = scrape(port)
    except httpx.HTTPError:
        return 0.0
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))
