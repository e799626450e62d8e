"""The run attempt, kept next to a checkpoint so that resuming from it starts a new attempt.

Events and commands carry ``attempt``: the steps a resumed run repeats are new data,
not late duplicates, and commands meant for the attempt that died are not applied
to the one that resumed. The trainer records its attempt in ``rlpulse_attempt.json``
in each checkpoint directory it saves (:func:`write_attempt`); a process resuming
from that checkpoint takes the next attempt and records it there at once
(:func:`resume_attempt`), so resuming twice from the same checkpoint gives two
different attempts.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from rlpulse.producers.exceptions import InvalidValueError

log = logging.getLogger(__name__)

ATTEMPT_FILE = "rlpulse_attempt.json"


def read_attempt(checkpoint_dir: Path, run_id: str) -> int | None:
    """The attempt recorded in ``checkpoint_dir`` for ``run_id``; None if none is.

    A file of another run id counts as none (a new run started from another's weights).
    """
    path = Path(checkpoint_dir) / ATTEMPT_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidValueError(str(path), "unreadable", f"a JSON attempt record ({exc})") from exc
    if not isinstance(record, dict) or record.get("run_id") != run_id:
        return None
    attempt = record.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise InvalidValueError(f"{path}: attempt", attempt, "an int >= 0")
    return attempt


def write_attempt(checkpoint_dir: Path, run_id: str, attempt: int) -> Path:
    """Record ``attempt`` of ``run_id`` in ``checkpoint_dir`` (atomically); return the file."""
    directory = Path(checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ATTEMPT_FILE
    temporary = directory / f".{ATTEMPT_FILE}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps({"run_id": run_id, "attempt": attempt}) + "\n")
    os.replace(temporary, path)
    return path


def resume_attempt(checkpoint_dir: Path, run_id: str) -> int:
    """The attempt of a process resuming ``run_id`` from ``checkpoint_dir``; recorded there.

    One more than the recorded attempt; 1 for a checkpoint without a record of this
    run (some attempt, taken to be 0, wrote it). If the directory is read-only the
    attempt is still returned, with a warning: resuming from it again repeats it.
    """
    recorded = read_attempt(checkpoint_dir, run_id)
    attempt = 1 if recorded is None else recorded + 1
    try:
        write_attempt(checkpoint_dir, run_id, attempt)
    except OSError as exc:
        log.warning("cannot record attempt %d in %s: %s", attempt, checkpoint_dir, exc)
    return attempt
