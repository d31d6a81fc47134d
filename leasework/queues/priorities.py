"""Priorities within a queue (pure): the levels, what a submit may ask, and each level's
Kafka topic.

A job has a priority from 0 (the highest, and the default) to 3 (the lowest), as Oban
numbers them: a submit's ``priority``, else its type's (``@app.job(priority=...)``), else 0.
Kafka has no priorities, so each level of a queue is a band with a topic of its own: level 0
is the queue's topic as before, level ``b`` is ``<base>.<queue>.p<b>`` (``jobs.ready.default.p2``):
a queue's name holds no ``.``, so no band's topic is ever another queue's. A worker consumes
every band of the queues it serves, one consumer each, and its slots for the queue go to the
highest band waiting, a waiting band rising one level per :data:`AGING` seconds so that a low
band is never starved (:mod:`leasework.worker.slots`; docs/design-decisions.md, "Priorities:
a topic per band, slots to the highest band waiting").
"""

from __future__ import annotations

from leasework.queues import DEFAULT as DEFAULT_QUEUE
from leasework.queues import consumer_group, name_error, ready_topic

HIGHEST = 0
LOWEST = 3
LEVELS = range(HIGHEST, LOWEST + 1)
DEFAULT = HIGHEST
# seconds a band waiting for slots takes to rise one level: a batch of level 3 waits at most
# 3 s behind a flood of level 0 before it is served in arrival order with it
AGING = 1.0
RULE = f"an integer from {HIGHEST} (the highest, and the default) to {LOWEST} (the lowest)"


def priority_error(value: object) -> str | None:
    """Why ``value`` cannot be a job's priority (None: it can)."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in LEVELS:
        return f"must be {RULE}"
    return None


def band_topic(base: str, queue: str, priority: int) -> str:
    """The topic of ``queue``'s wake-up messages of ``priority`` (``leasework_ready_topic``
    with three arguments, in SQL, says the same)."""
    if priority == HIGHEST:
        return ready_topic(base, queue)
    return f"{base}.{queue}.p{priority}"


def band_topics(base: str, queue: str) -> list[str]:
    """Every band's topic of ``queue``, highest first."""
    return [band_topic(base, queue, p) for p in LEVELS]


def band_group(group: str, priority: int) -> str:
    """The consumer group of a band: the queue's ``group`` for level 0 (its offsets stand),
    ``<group>.p<b>`` for the others, so a band's members never rebalance another's."""
    return group if priority == HIGHEST else f"{group}.p{priority}"


def band_of_topic(base: str, topic: str) -> tuple[str, int] | None:
    """The (queue, priority) whose band ``topic`` is (the inverse of :func:`band_topic`), or
    None for a topic that is no queue's (``jobs.dlq``, Kafka's own, a name no queue may have)."""
    if topic == base:
        return DEFAULT_QUEUE, HIGHEST
    if not topic.startswith(base + "."):
        return None
    queue, _, band = topic[len(base) + 1 :].partition(".")
    if name_error(queue) is not None:
        return None
    if not band:
        return (queue, HIGHEST) if queue != DEFAULT_QUEUE else None  # default's band 0 is ``base``
    level = band.removeprefix("p")
    if not level.isdigit() or band != f"p{int(level)}" or int(level) not in LEVELS[1:]:
        return None
    return queue, int(level)


def band_consumer_group(group: str, queue: str, priority: int) -> str:
    """The consumer group of ``queue``'s band ``priority``, its workers' ``group`` being the
    base (``LEASEWORK_CONSUMER_GROUP``)."""
    return band_group(consumer_group(group, queue), priority)
