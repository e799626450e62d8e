"""Stream processing: the pure step joiner and the faust worker."""
