"""Prometheus label values that the worker and the exporter write alike."""

from __future__ import annotations

__all__ = ["label_flag"]


def label_flag(value: bool) -> str:
    """A boolean as a Prometheus label value: ``true`` or ``false``."""
    return "true" if value else "false"
