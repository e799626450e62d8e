"""Delivery: from the write-ahead log to Kafka, off the training thread, each record once.

What a caller appended is sent from here, by its own process or, after a kill, by the next
process of the run on the host or ``rlpulse replay``. Batching, acknowledgement, read-back
and adoption are all in this room.

- :mod:`~rlpulse.producers.delivery.wal`: the write-ahead log on disk (frames, segments, claims);
- :mod:`~rlpulse.producers.delivery.spool_root`: where the logs live (node-local disk);
- :mod:`~rlpulse.producers.delivery.sender`: ``WalSender``, a logger's sender thread;
- :mod:`~rlpulse.producers.delivery.shipper`: ``LogShipper``, one log to Kafka in batches, in order;
- :mod:`~rlpulse.producers.delivery.readback`: what a topic already holds of a producer;
- :mod:`~rlpulse.producers.delivery.adoption`: finding, claiming and sending dead producers' logs;
- :mod:`~rlpulse.producers.delivery.replay`: ``rlpulse replay``, for a run that does not come back;
- :mod:`~rlpulse.producers.delivery.spool`: ``rlpulse spool``, what waits on this host.
"""
