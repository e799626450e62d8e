"""Rules texts a worker refuses before they replace its rules: counted by reason, rules kept."""

from __future__ import annotations

import time
from pathlib import Path

from rlpulse.rules.loader import load_preset
from rlpulse.settings import Settings
from rlpulse.streams.rulebook import REFUSALS, RuleBook, RulesFileWatcher, rule_book

ONE_RULE = """\
version: 1
rules:
  - id: only
    metric: loss
    when: "> 1"
    actions: [{stop: {}}]
"""


def counted_book(max_bytes: int | None = 4096) -> tuple[RuleBook, list[str], list[str]]:
    outcomes: list[str] = []
    refusals: list[str] = []
    book = RuleBook(
        load_preset("seed"),
        "<seed>",
        outcomes.append,
        max_bytes=max_bytes,
        on_refusal=refusals.append,
    )
    return book, outcomes, refusals


def rule_ids(book: RuleBook) -> list[str]:
    return [rule.id for rule in book.engine.rules]


def test_each_refusal_is_counted_by_its_reason_and_the_rules_stay() -> None:
    book, outcomes, refusals = counted_book()
    seed = rule_ids(book)
    assert not book.offer_bytes((ONE_RULE + "#" * 5000).encode(), "topic@1")
    assert not book.offer_bytes(b"\xff\xfe version: 1", "topic@2")
    assert not book.offer_bytes(b"version: 1\nrules: [{id: x}]\n", "topic@3")
    assert not book.offer("version: 1\n" + "#" * 5000, "file")
    assert refusals == ["too_large", "not_utf8", "invalid", "too_large"]
    assert outcomes == ["refused"] * 4
    assert rule_ids(book) == seed and book.origin == "<seed>"
    assert book.offer_bytes(ONE_RULE.encode(), "topic@4")
    assert rule_ids(book) == ["only"] and outcomes[-1] == "loaded"
    assert set(refusals) <= set(REFUSALS)


def test_a_rules_file_above_the_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(ONE_RULE)
    book, _outcomes, refusals = counted_book(max_bytes=len(ONE_RULE) + 10)
    watcher = RulesFileWatcher(book, path, interval_s=0.05)
    watcher.start(handle_sighup=False)
    try:
        path.write_text(ONE_RULE + "#" * 100)
        deadline = time.monotonic() + 10
        while not refusals and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.stop()
    assert refusals == ["too_large"]
    assert rule_ids(book) == [rule.id for rule in load_preset("seed").rules]


def test_the_limit_is_a_worker_setting(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(ONE_RULE)
    settings = Settings(worker={"rules": str(path), "rules_max_bytes": 2048})  # type: ignore[arg-type]
    book, _start = rule_book(settings)
    assert book.max_bytes == 2048
