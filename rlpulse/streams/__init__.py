"""Stream processing: the pure step core, and one subpackage per stream process.

The core is plain Python, without faust or Kafka: step keys (:mod:`.keys`), the step joiner
(:mod:`.joiner`), the step pipeline that joins and evaluates rules (:mod:`.pipeline`) and the
rule book that swaps rule sets (:mod:`.rulebook`). The processes move bytes in and out of it
or read the same topics: :mod:`.worker` (``rlpulse worker``), :mod:`.exporter`
(``rlpulse exporter``), :mod:`.archiver` (``rlpulse archive``) and :mod:`.indexer`
(``rlpulse index``), each with its settings section.
"""

# `streams/` at the repository root is a link to this folder (docs/design.md, "Layout"):
# importing it as `streams` would load every file a second time, under another name.
if __name__ != "rlpulse.streams":
    raise ImportError(f"import rlpulse.streams, not {__name__}: streams/ is a link to it")
