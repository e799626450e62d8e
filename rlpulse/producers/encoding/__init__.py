"""Encoding: what one call hands in, checked, and its bytes on the wire.

The values a trainer passes, as typed fields, checked for type and range, then encoded once
on the caller's thread into the bytes the write-ahead log holds and Kafka carries.

- :mod:`~rlpulse.producers.encoding.fields`: ``EventFields`` and ``LogFields``, one call's fields;
- :mod:`~rlpulse.producers.encoding.arguments`: checks of the caller's arguments, numbers included;
- :mod:`~rlpulse.producers.encoding.events`: ``EventEncoder``, the hot-path TrainerEvent encoder;
- :mod:`~rlpulse.producers.encoding.logs`: ``LogEncoder``, log records' entries and LogBatches.
"""
