"""The thin Kafka layer: where Kafka is, how clients are built, topics, start-up waits.

Knows nothing of rules, joiners or faust agents; everything above builds its Kafka clients
through :mod:`rlpulse.transport.clients`.
"""

from rlpulse.transport.bootstrap import BrokerRecord, bootstrap_servers
from rlpulse.transport.clients import new_admin, new_consumer, new_producer, trainer_producer
from rlpulse.transport.exceptions import (
    BrokerUnavailableError,
    ClientConfigError,
    SecurityFailureError,
    TopicError,
    TransportError,
)
from rlpulse.transport.readiness import Deadline, retry_until, wait_for_kafka
from rlpulse.transport.topics import delete_topics, ensure_topics

__all__ = [
    "BrokerRecord",
    "BrokerUnavailableError",
    "ClientConfigError",
    "Deadline",
    "SecurityFailureError",
    "TopicError",
    "TransportError",
    "bootstrap_servers",
    "delete_topics",
    "ensure_topics",
    "new_admin",
    "new_consumer",
    "new_producer",
    "retry_until",
    "trainer_producer",
    "wait_for_kafka",
]
