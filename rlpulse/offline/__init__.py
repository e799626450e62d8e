"""Offline analysis: what is asked of recordings after the fact, outside any stream process.

Rules backtests over recorded runs (:mod:`.backtest`), per-rank log aggregation
(:mod:`.aggregate`), and the questions asked of the archive: ``rlpulse diagnose``
(:mod:`.diagnose`) and ``rlpulse show`` (:mod:`.drilldown`). Files are read through
:mod:`rlpulse.schemas.jsonl` (the trainer's per-rank files) and :mod:`rlpulse.archive` (the
archive).
"""
