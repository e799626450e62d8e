"""Offline analysis of recordings: rules backtests and per-rank log aggregation."""
