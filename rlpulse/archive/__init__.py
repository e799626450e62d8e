"""The archive's format and its readers: every rlpulse topic as Parquet files, and DuckDB over them.

What a file holds and where it lies (:mod:`~rlpulse.archive.tables`,
:mod:`~rlpulse.archive.layout`), the local or S3 store it lies in
(:mod:`~rlpulse.archive.store`), the archive opened as DuckDB views
(:mod:`~rlpulse.archive.catalog`: ``rlpulse query``) and the audit of a run computed from it
(:mod:`~rlpulse.archive.audit`). Shared by the process that writes the archive
(:mod:`rlpulse.streams.archiver`, which also publishes audits) and the offline analysis that
reads it (:mod:`rlpulse.offline`). Needs pyarrow and duckdb (the ``streams`` extra).
"""
