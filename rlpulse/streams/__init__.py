"""Stream processing: the pure step joiner and the faust worker."""

if __name__ != "rlpulse.streams":  # the repo root's `streams` is a link to this folder; see docs/design.md
    raise ImportError(f"import rlpulse.streams, not {__name__}: `streams/` at the repository root is a "
                      "link to rlpulse/streams, never a package of its own")

