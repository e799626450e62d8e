"""Delivery: from the write-ahead log to Kafka, by the host's agent, each record once.

The training process appends to its write-ahead log; one agent per host (and user and
cluster), another process, sends every log of the host, a dead writer's too. Frames,
batching, acknowledgement, read-back, the agent and its wake are all in this room.

- :mod:`~rlpulse.producers.delivery.wal`: the write-ahead log on disk (frames, segments, claims);
- :mod:`~rlpulse.producers.delivery.spool_root`: where the logs live (node-local disk);
- :mod:`~rlpulse.producers.delivery.agent_place`: where a host's agent lives, and its wake;
- :mod:`~rlpulse.producers.delivery.agent`: ``HostAgent``, ``rlpulse agent``;
- :mod:`~rlpulse.producers.delivery.agent_process`: starting it, detached or in the foreground;
- :mod:`~rlpulse.producers.delivery.watch`: a rank's watch that keeps an agent alive;
- :mod:`~rlpulse.producers.delivery.shipper`: ``LogShipper``, one log to Kafka in batches, in order;
- :mod:`~rlpulse.producers.delivery.readback`: what a topic already holds of a producer;
- :mod:`~rlpulse.producers.delivery.clock`: this host's clock against the brokers';
- :mod:`~rlpulse.producers.delivery.spool`: ``rlpulse spool``, what waits on this host and who
  sends it, and ``spool send`` for logs no agent serves.
"""
