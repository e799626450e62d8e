"""RuleBook swaps rule sets atomically, refuses bad texts, and follows a rules file."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rlpulse.rules import load_preset
from rlpulse.streams.rulebook import RuleBook, RulesFileWatcher

ONE_RULE = """\
version: 1
rules:
  - id: kl-guard
    metric: kl_divergence
    when: "> {threshold}"
    for_steps: 3
    actions: [{{stop: {{}}}}]
"""


def test_offer_swaps_valid_new_text_and_refuses_bad_text() -> None:
    outcomes: list[str] = []
    book = RuleBook(load_preset("seed"), "<preset seed>", outcomes.append)
    assert book.offer(ONE_RULE.format(threshold=0.3), "v1")
    assert [r.id for r in book.engine.rules] == ["kl-guard"]
    assert not book.offer(ONE_RULE.format(threshold=0.3), "v1 again"), "same text: no swap"
    engine = book.engine
    assert not book.offer(ONE_RULE.format(threshold="high"), "broken")
    assert book.engine is engine and book.origin == "v1"
    assert book.offer(ONE_RULE.format(threshold=0.4), "v2")
    assert book.engine.rules[0].version != engine.rules[0].version
    assert outcomes == ["loaded", "refused", "loaded"]


def wait_until(condition: object, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.05)
    return False


def test_file_watcher_reloads_on_change_and_on_sighup(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    outcomes: list[str] = []
    book = RuleBook(load_preset("seed"), "<preset seed>", outcomes.append)
    watcher = RulesFileWatcher(book, path, interval_s=0.1)
    watcher.start(handle_sighup=True)
    try:
        path.write_text(ONE_RULE.format(threshold=0.3))  # appears after start: loaded
        assert wait_until(lambda: book.origin == str(path))
        first = book.engine
        path.write_text(ONE_RULE.format(threshold=0.35))
        assert wait_until(lambda: book.engine is not first)
        second = book.engine
        fixed = ONE_RULE.format(threshold=0.5)
        broken = "version: 1\nrules: nope\n"
        path.write_text(broken + "#" * (len(fixed) - len(broken)))  # as long as the fix
        edited = path.stat()
        refused_before = outcomes.count("refused")
        assert wait_until(
            lambda: (
                watcher._seen == (edited.st_mtime_ns, edited.st_size)
                and outcomes.count("refused") > refused_before
            )
        ), "the watcher never read the broken edit"
        assert book.engine is second, "a broken edit changes nothing"
        # An edit polling cannot see (the same size, its mtime put back): only SIGHUP loads it.
        path.write_text(fixed)
        os.utime(path, ns=(edited.st_atime_ns, edited.st_mtime_ns))
        os.kill(os.getpid(), signal.SIGHUP)
        assert wait_until(lambda: book.engine is not second)
        assert book.engine.rules[0].when.threshold == 0.5  # type: ignore[union-attr]
    finally:
        watcher.stop()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
