"""The caller's side: what a training loop holds and calls, on its own thread.

A newcomer starts here: the objects a trainer makes, and what each call does before the
record is in the write-ahead log (:mod:`rlpulse.producers.delivery`) and ``log()`` returns.

- :mod:`~rlpulse.producers.caller.link`: ``RunLink``, events out and commands in, per process;
- :mod:`~rlpulse.producers.caller.logger`: ``EventLogger``, which checks, numbers, encodes and
  appends each record and wakes the host's agent (one is started if none runs);
- :mod:`~rlpulse.producers.caller.logging_handler`: ``EventHandler``, ``logging`` records to events
  and text log records;
- :mod:`~rlpulse.producers.caller.sampling`: ``SamplingFilter``, a share of DEBUG and INFO records;
- :mod:`~rlpulse.producers.caller.trace`: the trace context that ties records of all ranks;
- :mod:`~rlpulse.producers.caller.system`: ``SystemSampler``, a rank's CPU, memory and GPU;
- :mod:`~rlpulse.producers.caller.rankfiles`: ``RankFileSink``, the rank's local JSON Lines copy;
- :mod:`~rlpulse.producers.caller.attempts`: the run attempt kept next to a checkpoint;
- :mod:`~rlpulse.producers.caller.ending`: ``RunEnding``, the one ``run_end`` of an attempt.
"""
