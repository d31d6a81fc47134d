"""``python -m leasework.lagprobe BROKERS GROUP TOPIC``: print the group's lag per partition as
JSON and exit.

The relay runs this in a short-lived child process rather than in its own: group-offset
queries go through librdkafka's coordinator machinery, which the chaos harness saw abort the
whole process (an assertion in librdkafka) under Kafka link faults. A probe that aborts costs
one missing lag sample, not the relay.
"""

from __future__ import annotations

import json
import sys

from confluent_kafka import Consumer

from leasework.kafka import group_lag


def main(argv: list[str]) -> int:
    brokers, group, topic = argv
    probe = Consumer(
        {
            "bootstrap.servers": brokers,
            "client.id": "leasework-lagprobe",
            "group.id": group,  # reads the group's committed offsets; never subscribes
            "enable.auto.commit": False,
            "socket.connection.setup.timeout.ms": 3000,
        }
    )
    try:
        print(json.dumps(group_lag(probe, topic, timeout=4.0)))
    finally:
        probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
