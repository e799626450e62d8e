"""Reading a ``_bulk`` response: which documents landed, which to send again, which to refuse.

Per document, the search engine answers with a status: 2xx landed (``created``, or
``updated`` when a document with that id was there: a record indexed again); 429 (its queues
are full) and 5xx are worth another try; any other status is the document's own fault (a
field the mapping cannot take, an index it may not write) and is refused for good, with the
engine's reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BulkOutcome", "read_bulk_response", "retryable_status"]


def retryable_status(status: int | None) -> bool:
    """Whether a request or a document refused with ``status`` may succeed if sent again."""
    return status is None or status == 429 or status >= 500


@dataclass
class BulkOutcome:
    """What became of each document of one ``_bulk`` request (by position in ``sent``)."""

    created: int = 0
    updated: int = 0
    retry: list[int] = field(default_factory=list)
    """Positions to send again."""
    rejected: list[tuple[int, str]] = field(default_factory=list)
    """Positions refused for good, each with the reason."""


def read_bulk_response(response: Mapping[str, Any], sent: Sequence[int]) -> BulkOutcome:
    """Sort the documents at ``sent`` (positions, in request order) by the response's items.

    A response with fewer items than documents sent (it should never happen) has the missing
    ones sent again.
    """
    outcome = BulkOutcome()
    items = response.get("items") or []
    for position, item in zip(sent, items, strict=False):
        answer: Mapping[str, Any] = (
            next(iter(item.values()), {}) if isinstance(item, Mapping) else {}
        )
        status = answer.get("status")
        if isinstance(status, int) and 200 <= status < 300:
            if answer.get("result") == "updated":
                outcome.updated += 1
            else:
                outcome.created += 1
        elif retryable_status(status if isinstance(status, int) else None):
            outcome.retry.append(position)
        else:
            outcome.rejected.append((position, _reason(status, answer.get("error"))))
    outcome.retry.extend(sent[len(items) :])
    return outcome


def _reason(status: object, error: object) -> str:
    """``<status> <type>: <reason>`` from a document's error, with its cause when it has one."""
    if not isinstance(error, Mapping):
        return f"{status} {error}"
    text = f"{status} {error.get('type')}: {error.get('reason')}"
    cause = error.get("caused_by")
    if isinstance(cause, Mapping):
        text += f" (caused by {cause.get('type')}: {cause.get('reason')})"
    return text
