"""The run page (`rlpulse ui`) in a real headless Chromium, over a real recorded run.

The demo's run is played on the session broker with a real worker (seed rules) and a real
archiver; the page's server reads the archive and the live topics. What a user checks:
the reward chart has one point per step, the heatmap a cell per rank and step, each command
(the rollout doublings, kl-guard's stop) is marked at the step its ack says with the rule's
explanation, a click on the stop's step opens that step with its ERROR records and its
command, a running run's page gains steps by itself, and bad input gets a message.

Chromium is Debian's (``apt-get install chromium``, in the README's set-up line), driven by
Playwright from PyPI. Screenshots of the run page and the step panel are written to
``$RUN_PAGE_SCREENSHOTS`` (default: the test's temporary directory); docs/watching.md shows
copies of them.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from pydantic import SecretStr
from rich.console import Console

from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.child_process import free_port
from rlpulse.local.demo import SAMPLES_PER_STEP, WORLD_SIZE, play
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ArchiveSettings, Settings
from rlpulse.transport.topics import ensure_topics
from rlpulse.ui.data import run_data
from rlpulse.ui.server import UiServer
from tests.kafka import read_all, settings_at
from tests.waiting import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
LOAD_MS = 60_000


@dataclass
class Recorded:
    """The recorded run, its commands' acks (read from the acks topic), and the page."""

    settings: Settings
    run_id: str
    applied: dict[str, list[int]]
    """Applied step of each acked command, by rule id, in order."""
    server: UiServer
    workdir: Path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail("the run page's tests need Chromium: apt-get install -y chromium")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def recorded(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    workdir = tmp_path_factory.mktemp("run-page")
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    settings = settings_at(kafka_bootstrap, topics, archive={"root": str(workdir / "archive")})
    ensure_topics(settings, topics, partitions=3)
    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, workdir / "worker.log", partitions=3, grace_s=5.0
    )
    archiver = ArchiverProcess(
        kafka_bootstrap, topics.prefix, workdir / "archive", workdir / "archiver.log",
        {"archive.roll_s": 0.5},
    )  # fmt: skip
    with worker, archiver:
        worker.wait_consuming(timeout_s=90.0)
        run_id = f"recorded-{uuid.uuid4().hex[:6]}"
        quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115 -- closed with the console
        assert play(quiet, settings, workdir, worker.alive, 0.1, run_id=run_id) == 0
        acks = read_all(
            kafka_bootstrap, topics.acks, lambda messages: len(messages) >= 4, timeout_s=60
        )
        commands = {
            c["command_id"]: c
            for c in map(default_codec().decode_command, _values(read_all(
                kafka_bootstrap, topics.control, lambda m: len(m) >= 4, timeout_s=60
            )))
        }  # fmt: skip
        applied: dict[str, list[int]] = {}
        for ack in map(default_codec().decode_ack, _values(acks)):
            rule = commands[ack["command_id"]]["rule_id"] or "operator"
            step = ack["applied_at_step"]
            assert step is not None, ack
            applied.setdefault(rule, []).append(step)
        server = UiServer(run_data(settings), port=0)
        server.start()
        try:
            yield Recorded(settings, run_id, applied, server, workdir)
        finally:
            server.stop()


def _values(messages: list[Any]) -> list[bytes]:
    return [message.value() for message in messages]


FAILED_REQUESTS: dict[int, list[str]] = {}
"""Per page (its id): each request that failed or answered 400 or more."""


def _open(browser: Browser, url: str) -> Page:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    failed = FAILED_REQUESTS.setdefault(id(page), [])
    page.on("requestfailed", lambda request: failed.append(f"{request.url}: failed"))
    page.on(
        "response",
        lambda response: (
            failed.append(f"{response.url}: {response.status}") if response.status >= 400 else None
        ),
    )
    page.goto(url)
    page.wait_for_function("window.rlpulseReady === true", timeout=LOAD_MS)
    return page


def _tick_labels(page: Page, selector: str) -> list[str]:
    """The texts of a chart's axis tick labels (SVG text, so read as textContent)."""
    labels: list[str] = page.evaluate(
        "s => Array.from(document.querySelectorAll(s)).map(t => t.textContent)", selector
    )
    return labels


def _run_url(recorded: Recorded, run_id: str | None = None) -> str:
    return f"{recorded.server.url}run?id={run_id or recorded.run_id}"


def _screenshot(page: Page, name: str, tmp_path: Path, selector: str | None = None) -> Path:
    folder = Path(os.environ.get("RUN_PAGE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if selector is None:
        page.screenshot(path=str(path), full_page=True)
    else:
        page.locator(selector).screenshot(path=str(path))
    return path


def test_the_run_list_shows_the_run_and_who_stopped_it(
    recorded: Recorded, browser: Browser
) -> None:
    page = _open(browser, recorded.server.url)
    row = page.locator("#runs tr", has_text=recorded.run_id)
    stop = recorded.applied["kl-guard"][0]
    assert f"stopped by kl-guard at step {stop}" in row.inner_text()
    page.locator(f"#runs a:text-is('{recorded.run_id}')").click()
    page.wait_for_function("window.rlpulseReady === true", timeout=LOAD_MS)
    assert page.locator("#title").inner_text() == recorded.run_id


def test_the_charts_have_a_point_per_step_and_a_cell_per_rank_and_step(
    recorded: Recorded, browser: Browser, tmp_path: Path
) -> None:
    page = _open(browser, _run_url(recorded))
    stop = recorded.applied["kl-guard"][0]
    steps = list(range(1, stop + 1))
    reward = page.evaluate(
        "document.getElementById('main-chart').data.find(t => t.name === 'reward_mean (mean)').x"
    )
    assert reward == steps  # one point per step, 1..the stop
    assert page.locator("#metric-a").input_value() == "rollout|reward_mean"
    assert page.locator("#metric-b").input_value() == "actor|kl_divergence"
    heat = page.evaluate("document.getElementById('heatmap').data[0]")
    assert heat["y"] == list(range(WORLD_SIZE)) and heat["x"] == steps
    assert len(heat["z"]) == WORLD_SIZE and all(len(row) == len(steps) for row in heat["z"])
    assert all(value is not None for row in heat["z"] for value in row)  # every rank reported
    assert "1 rank \u00d7 1 step" in page.locator("#heat-resolution").inner_text()
    rank_ticks = _tick_labels(page, "#heatmap .ytick text")
    assert rank_ticks == [str(rank) for rank in range(WORLD_SIZE)], rank_ticks  # whole ranks
    count_ticks = _tick_labels(page, "#timing .y2tick text")
    assert count_ticks and all(tick.isdigit() for tick in count_ticks), count_ticks
    assert FAILED_REQUESTS[id(page)] == []  # every resource the page asked for came
    shot = _screenshot(page, "run-page.png", tmp_path)
    assert shot.stat().st_size > 10_000


def test_each_command_is_marked_at_its_applied_step_with_its_explanation(
    recorded: Recorded, browser: Browser
) -> None:
    page = _open(browser, _run_url(recorded))
    marks = page.evaluate(
        "(() => { const t = document.getElementById('main-chart').data"
        ".find(t => t.name === 'commands'); return {x: t.x, text: t.hovertext}; })()"
    )
    doublings = recorded.applied["unstable-reward"]
    stop = recorded.applied["kl-guard"]
    assert sorted(marks["x"]) == sorted(doublings + stop)
    by_step = dict(zip(marks["x"], marks["text"], strict=True))
    for step in doublings:
        assert "unstable-reward: scale_rollout_batch" in by_step[step]
        assert "var of reward_mean over the last 5 steps" in by_step[step]
    assert "kl-guard: checkpoint + stop" in by_step[stop[0]]
    assert "for 3 consecutive steps" in by_step[stop[0]]
    shapes = page.evaluate("document.getElementById('main-chart').layout.shapes.map(s => s.x0)")
    assert sorted(shapes) == sorted(doublings + stop)  # a line across the chart at each
    table = page.locator("#commands").inner_text()
    assert table.count("unstable-reward") == len(doublings) and "kl-guard" in table
    # The demo's two doublings did not calm the reward; the firings at the cap were noops.
    assert "verdict" in table
    for applied in sorted(doublings)[:2]:
        assert f"ineffective at {applied + 10}" in table, table
    assert table.count("unknown") == len(doublings) - 2, table


def test_a_click_on_the_stop_step_opens_its_errors_and_its_command(
    recorded: Recorded, browser: Browser, tmp_path: Path
) -> None:
    page = _open(browser, _run_url(recorded))
    stop = recorded.applied["kl-guard"][0]
    # The pixel of the stop's step on the main chart, from Plotly's own axis.
    x, y = page.evaluate(
        f"""(() => {{
          const gd = document.getElementById('main-chart'), l = gd._fullLayout;
          const box = gd.getBoundingClientRect();
          return [box.left + l._size.l + l.xaxis.l2p({stop}), box.top + l._size.t + l._size.h / 2];
        }})()"""
    )
    page.mouse.click(x, y)
    page.wait_for_function(f"window.rlpulse.step && window.rlpulse.step.step === {stop}")
    assert page.locator("#step-title").inner_text() == f"Step {stop}"
    panel = page.locator("#step-panel")
    first_log = panel.locator("#step-logs tbody tr").first
    assert "ERROR" in first_log.inner_text()  # most severe first
    assert "above 0.3" in first_log.inner_text()
    assert "kl-guard" in panel.inner_text() and "checkpoint, stop" in panel.inner_text()
    shot = _screenshot(page, "step-panel.png", tmp_path, "#step-panel")
    assert shot.stat().st_size > 5_000
    errors = panel.locator("#step-logs tr.level-ERROR").count()
    assert errors >= WORLD_SIZE // 2  # every even rank logs an ERROR while the KL is high
    page.locator("#log-level").select_option("INFO")
    assert panel.locator("#step-logs tr.level-ERROR").count() == 0
    page.locator("#log-level").select_option("")
    page.locator("#log-rank").fill("2")
    ranks = panel.locator("#step-logs tbody tr td:nth-child(4)").all_inner_texts()
    assert ranks and set(ranks) == {"2"}


def test_a_running_run_gains_steps_by_itself(recorded: Recorded, browser: Browser) -> None:
    settings = recorded.settings.model_copy(
        update={"logging": recorded.settings.logging.model_copy(update={"enabled": False})}
    )
    run_id = f"live-{uuid.uuid4().hex[:6]}"
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    result: list[int] = []
    player = threading.Thread(
        target=lambda: result.append(
            play(quiet, settings, recorded.workdir, lambda: True, 0.4, run_id)
        ),
        daemon=True,
    )
    player.start()
    wait_for(
        lambda: any(
            r["run_id"] == run_id and r["last_step"] >= 3 for r in recorded.server.data.runs()
        ),
        "the live run's first steps",
        timeout_s=60,
    )
    page = _open(browser, _run_url(recorded, run_id))
    assert "running" in page.locator("#status").inner_text()
    first = page.evaluate("window.rlpulse.series.a.steps.length")
    page.wait_for_function(f"window.rlpulse.series.a.steps.length >= {first + 3}", timeout=LOAD_MS)
    # A step with no log records (this run logs none) says so.
    page.evaluate("openStep(2)")
    page.wait_for_function("window.rlpulse.step && window.rlpulse.step.step === 2")
    assert "No log records within 2 s of step 2" in page.locator("#step-logs").inner_text()
    player.join(timeout=120)
    assert result == [0]
    # Two runs on one chart: the other's reward mean as a third curve, step for step.
    page = _open(browser, f"{_run_url(recorded)}&compare={run_id}")
    other = page.evaluate(
        f"document.getElementById('main-chart').data.find(t => t.name === '{run_id}: reward_mean')"
    )
    assert other["x"] == page.evaluate("window.rlpulse.series.compare.steps")
    assert len(other["x"]) == recorded.server.data.overview(run_id)["last_step"]


def test_bad_input_gets_a_message(recorded: Recorded, browser: Browser, tmp_path: Path) -> None:
    page = _open(browser, _run_url(recorded, "no-such-run"))
    assert "no run 'no-such-run'" in page.locator("#error").inner_text()
    page = _open(browser, f"{recorded.server.url}run")
    assert "No run given" in page.locator("#error").inner_text()
    page = _open(browser, _run_url(recorded))
    page.evaluate("openStep(100000)")
    page.wait_for_function("window.rlpulse.step && window.rlpulse.step.step === 100000")
    assert "nothing of step 100000" in page.locator("#step-body").inner_text()
    # An empty archive and no live topics: the list says so, and why.
    empty = recorded.settings.model_copy(
        update={
            "archive": recorded.settings.archive.model_copy(
                update={"root": str(tmp_path / "nothing-here")}
            ),
            "bootstrap": f"127.0.0.1:{free_port()}",  # no broker listens there
        }
    )
    server = UiServer(run_data(empty), port=0)
    server.start()
    try:
        page = _open(browser, server.url)
        text = page.locator("main").inner_text()
        assert "No runs yet" in text
        assert f"no archive at {tmp_path / 'nothing-here'}" in text
        wait_for(lambda: server.data.live_problem() not in (None, "not started"), "live error")
        page = _open(browser, server.url)
        assert "cannot read the live topics" in page.locator("#notices").inner_text()
    finally:
        server.stop()
    # The archive down (an S3 endpoint nobody answers at): said so, and the live topics shown.
    down = recorded.settings.model_copy(
        update={
            "archive": ArchiveSettings(
                root="s3://archive/rlpulse",
                s3_endpoint=f"http://127.0.0.1:{free_port()}",
                s3_access_key_id="key",
                s3_secret_access_key=SecretStr("secret"),
            )
        }
    )
    server = UiServer(run_data(down), port=0)
    server.start()
    try:
        wait_for(
            lambda: any(r["run_id"] == recorded.run_id for r in server.data.runs()),
            "the recorded run from the live topics",
            timeout_s=60,
        )
        page = _open(browser, server.url)
        notices = page.locator("#notices").inner_text()
        assert "cannot reach the archive at s3://archive/rlpulse" in notices
        assert recorded.run_id in page.locator("#runs").inner_text()
    finally:
        server.stop()


def test_a_step_s_samples_show_their_reward_histogram_and_chosen_texts(
    recorded: Recorded, browser: Browser, tmp_path: Path
) -> None:
    """Rank 0 of the recorded run logs 64 samples a step; past the KL limit some loop."""
    page = _open(browser, _run_url(recorded))
    stop = recorded.applied["kl-guard"][0]
    page.evaluate(f"openStep({stop})")
    page.wait_for_function(f"window.rlpulse.step && window.rlpulse.step.step === {stop}")
    (part,) = page.evaluate("window.rlpulse.step.samples")
    assert (part["split"], part["count"]) == ("train", SAMPLES_PER_STEP)
    assert sum(part["counts"]) == SAMPLES_PER_STEP  # the histogram is over every sample
    page.wait_for_function(
        "(() => { const c = document.getElementById('samples-train');"
        " return c && c.data && c.data.length === 1; })()"
    )
    bars = page.evaluate("document.getElementById('samples-train').data[0].y")
    assert sum(bars) == SAMPLES_PER_STEP
    cards = page.locator("#step-panel .sample")
    assert cards.count() == len(part["texts"])
    reasons = {reason for text in part["texts"] for reason in text["chosen"]}
    assert {"best", "worst", "truncated", "group"} <= reasons, reasons
    rewards = [text["reward"] for text in part["texts"]]
    assert rewards == sorted(rewards, reverse=True)  # best first
    first = cards.first.inner_text()
    assert "best" in first and "correct=" in first
    looping = page.locator("#step-panel .sample", has_text="truncated").first
    assert "let me add them again" in looping.inner_text()
    assert looping.locator(".cut").count() == 1  # its middle was cut, and it says so
    assert "characters cut" in looping.locator(".cut").inner_text()
    shot = _screenshot(page, "run-page-samples.png", tmp_path, "#step-samples")
    assert shot.stat().st_size > 5_000
