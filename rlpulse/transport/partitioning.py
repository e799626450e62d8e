"""Which partition a run's records live on: Kafka's default partitioner, computed here.

Every client that writes a record keyed by run partitions it with murmur2 as Kafka's Java
client does (librdkafka's ``murmur2_random``, faust's and aiokafka's default): partition =
``(murmur2(key) & 0x7fffffff) % partitions``. A reader that wants one run (a trainer's control
client) computes that partition with :func:`partition_for` and reads it alone, instead of every
partition of a topic that carries all the cluster's runs.
"""

from __future__ import annotations

from typing import Final

__all__ = ["PARTITIONER", "murmur2", "partition_for"]

PARTITIONER: Final = "murmur2_random"
"""librdkafka's name for the partitioner every rlpulse producer uses."""

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """The 32-bit murmur2 hash of ``data`` as Kafka computes it (unsigned)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of ``partitions`` that Kafka's default partitioner gives ``key``."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
