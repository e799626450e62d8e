"""Stream processing: the pure step joiner and the faust worker."""

# `streams/` at the repository root is a link to this folder (docs/design.md, "Layout"):
# importing it as `streams` would load every file a second time, under another name.
if __name__ != "rlpulse.streams":
    raise ImportError(f"import rlpulse.streams, not {__name__}: streams/ is a link to it")
