"""The archiver process (``rlpulse archive``): every rlpulse topic into the archive.

:mod:`~rlpulse.streams.archiver.archiver` consumes the topics and writes Parquet files in the
archive's format (:mod:`rlpulse.archive`), effectively once, rolled by size and time
(:mod:`.buffer`), written on a writer thread in order (:mod:`.writer`), pruned by age
(:mod:`.prune`), and publishes each run's audit. Reading the
archive is :mod:`rlpulse.archive` and :mod:`rlpulse.offline`.
"""
