"""The worker process (``rlpulse worker``): the faust shell around the pure step pipeline.

:mod:`~rlpulse.streams.worker.run` starts it; :mod:`~rlpulse.streams.worker.app` is its
faust app and agent, which only move bytes between Kafka and
:class:`~rlpulse.streams.pipeline.StepPipeline`; the rest keeps its state in faust tables
(:mod:`.write_behind`, :mod:`.state_codec`, :mod:`.json_values`), sends in order
(:mod:`.outbox`), watches what faust delivers (:mod:`.read_tracker`,
:mod:`.faust_consumer`) and counts it all for Prometheus (:mod:`.metrics`).
"""
