"""``rlpulse index``: the trainers' log records and the worker's step summaries in a search engine.

:mod:`.documents` turns decoded records into documents (pure), :mod:`.template` holds the
index template they are written under, :mod:`.bulk` reads a ``_bulk`` response, and
:mod:`.indexer` is the process: a Kafka consumer group that sends ``_bulk`` requests to
OpenSearch or Elasticsearch and commits offsets only after every document landed.
"""
