"""Which Kafka offsets may be committed.

Several messages of one partition run at once and finish in any order; an offset may be
committed only once every message received before it on that partition has finished, or a
crash would skip the unfinished ones. :class:`OffsetTracker` keeps, per partition, the
offsets in the order they arrived and answers the next offset to commit (Kafka's
convention: the last finished offset of the contiguous prefix, plus one). Offsets are taken
in arrival order, so gaps in the log (compaction, control records) need no special case.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Partition:
    arrived: deque[int] = field(default_factory=deque)
    finished: set[int] = field(default_factory=set)
    next_commit: int | None = None
    committed: int | None = None


class OffsetTracker:
    def __init__(self) -> None:
        self._partitions: dict[int, _Partition] = {}

    def start(self, partition: int, offset: int) -> bool:
        """Track a message that arrived; True when it rewound the partition. librdkafka
        rewinds a partition by itself (it was lost and fetched again from the committed
        offset, with no revoke this side saw): the partition's tracking starts over. A
        message of the old run that finishes later only ever stands for work already done,
        so counting it in the new prefix never commits past unfinished work."""
        state = self._partitions.setdefault(partition, _Partition())
        rewound = bool(state.arrived) and offset <= state.arrived[-1]
        if rewound:
            state = self._partitions[partition] = _Partition(committed=state.committed)
        state.arrived.append(offset)
        return rewound

    def finish(self, partition: int, offset: int) -> None:
        state = self._partitions.get(partition)
        if state is None:
            return  # revoked meanwhile: nothing of ours to commit
        state.finished.add(offset)
        while state.arrived and state.arrived[0] in state.finished:
            done = state.arrived.popleft()
            state.finished.discard(done)
            state.next_commit = done + 1

    def committable(self) -> dict[int, int]:
        """Partition -> next offset, for partitions whose finished prefix grew since the last
        call to :meth:`committed`."""
        return {
            partition: state.next_commit
            for partition, state in self._partitions.items()
            if state.next_commit is not None and state.next_commit != state.committed
        }

    def committed(self, partition: int, next_offset: int) -> None:
        if (state := self._partitions.get(partition)) is not None:
            state.committed = next_offset

    def forget(self, partition: int) -> None:
        """The partition was revoked: its offsets are another consumer's to commit now."""
        self._partitions.pop(partition, None)

    def in_flight(self) -> int:
        return sum(len(s.arrived) for s in self._partitions.values())

    def positions(self) -> dict[int, int]:
        """Partition -> next offset of the finished prefix, whether stored already or not:
        what a synchronous commit (revoke, shutdown) sends."""
        return {
            partition: state.next_commit
            for partition, state in self._partitions.items()
            if state.next_commit is not None
        }
