"""The archive: every rlpulse topic in Parquet, and the questions asked of it.

:mod:`~rlpulse.streams.archive.archiver` writes it (``rlpulse archive``), effectively once,
rolled by size and time and pruned by age; :mod:`~rlpulse.streams.archive.catalog` opens it
as DuckDB views (``rlpulse query``); :mod:`~rlpulse.streams.archive.diagnose`,
:mod:`~rlpulse.streams.archive.drilldown` and :mod:`~rlpulse.streams.archive.audit` answer
``rlpulse diagnose``, ``rlpulse show`` and ``rlpulse audit``. Needs pyarrow and duckdb (the
``streams`` extra).
"""
