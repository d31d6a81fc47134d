"""The consumer-lag service: exports the workers' consumer-group lag per queue, priority band
and partition (``leasework_consumer_lag``), each band measured from outside its group
(committed offsets against high watermarks), so a worker cut off from Kafka still shows up as
lag. The measuring is done by a long-lived child process (:mod:`leasework.relay.lagprobe`,
which says why a child); a pass is one life of it, and a probe that died is started again
after the interval."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import trio

from leasework import metrics
from leasework.config import Settings
from leasework.delivery_marks import Snapshot, parse_sample
from leasework.relay.service import Backoff, Pass, run_passes

log = logging.getLogger("leasework.relay.lag")

LAG_EVERY = 5.0  # seconds between consumer-lag samples


@dataclass(frozen=True)
class LagConfig:
    # the brokers, the workers' consumer group and the topic it consumes
    brokers: tuple[str, ...]
    group: str
    topic: str
    # seconds between samples, and before a probe that exited is started again
    every: float = LAG_EVERY
    # after an unexpected failure (a bug; a probe that cannot start is logged and waited for)
    backoff: Backoff = Backoff.from_interval(LAG_EVERY)

    @classmethod
    def from_settings(cls, settings: Settings) -> LagConfig:
        return cls(settings.kafka_brokers, settings.consumer_group, settings.topic_ready)

    def command(self) -> list[str]:
        """The probe's command line."""
        return [
            sys.executable,
            "-m",
            "leasework.relay.lagprobe",
            ",".join(self.brokers),
            self.group,
            self.topic,
            str(self.every),
        ]


@dataclass(frozen=True)
class ProbeRun(Pass):
    """One life of the probe: the samples it exported, and how it ended (its exit status, or
    None when it could not be started)."""

    samples: int
    returncode: int | None


class ConsumerLag:
    def __init__(
        self, config: LagConfig, readings: Callable[[Snapshot], None] | None = None
    ) -> None:
        """``readings``: given every sample's positions (the recovery service's)."""
        self.config = config
        self.readings = readings

    async def run_once(self) -> ProbeRun:
        """Run the probe until it exits, exporting each sample it prints."""
        try:
            return await read_lag_samples(self.config.command(), self.readings)
        except OSError as exc:
            log.warning("consumer lag probe could not run", extra={"error": str(exc)[:200]})
            return ProbeRun(0, None)

    async def run(self) -> None:
        await run_passes(
            "consumer lag", self.run_once, interval=self.config.every, backoff=self.config.backoff
        )


async def read_lag_samples(
    command: list[str], readings: Callable[[Snapshot], None] | None = None
) -> ProbeRun:
    """Run the probe and export each JSON line it prints, until it exits; each sample's
    positions go to ``readings`` too."""
    child = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    samples = 0
    try:
        buffer = b""
        async for chunk in child.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                samples += export_lag_sample(line, readings)
    finally:
        with trio.CancelScope(shield=True):
            child.kill()
            await child.wait()
    log.debug("consumer lag probe exited", extra={"returncode": child.returncode})
    return ProbeRun(samples, child.returncode)


def export_lag_sample(line: bytes, readings: Callable[[Snapshot], None] | None = None) -> bool:
    """Export one line of the probe's; whether it was a sample (not an error, not noise). A
    band the sample says it could not read keeps its last values; a band's partition the
    sample has nothing of (its queue's topics deleted) is no longer exported. The sample's
    positions go to ``readings``, when given."""
    try:
        sample = json.loads(line)
    except ValueError:
        return False
    if not isinstance(sample, dict) or not isinstance(sample.get("lag"), list):
        return False  # an error (one missed sample) or noise
    if readings is not None and (snapshot := parse_sample(sample)) is not None:
        readings(snapshot)
    unread = {
        (str(b[0]), str(b[1]))
        for b in (sample.get("unread") or [])
        if isinstance(b, list) and len(b) == 2
    }
    seen: set[tuple[str, str, str]] = set()
    for entry in sample["lag"]:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[3], int)):
            continue
        labels = (str(entry[0]), str(entry[1]), str(entry[2]))
        metrics.consumer_lag.labels(*labels).set(entry[3])
        seen.add(labels)
    for labels in exported_lag_labels() - seen:
        if labels[:2] not in unread:
            metrics.consumer_lag.remove(*labels)
    return True


def exported_lag_labels() -> set[tuple[str, str, str]]:
    """The (queue, priority, partition) of every ``leasework_consumer_lag`` series exported."""
    return {
        (s.labels["queue"], s.labels["priority"], s.labels["partition"])
        for family in metrics.consumer_lag.collect()
        for s in family.samples
    }
