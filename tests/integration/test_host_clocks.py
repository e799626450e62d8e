"""Two hosts, one clock 5 s behind: the archive, ``show``, ``diagnose`` and the audit put the
step's records in the order they happened, by the offsets the hosts' agents measured.

Two rank processes of one run stand for two hosts (``producer.hostname`` clock-a and clock-b,
so each starts its own host agent); clock-b runs under Debian's ``faketime`` 5 s in the past,
and so does the agent it starts (it inherits the environment). The test tells the ranks in
turn to log an event and a text record of one step, each turn once the one before was
logged and 0.3 s later, so the real order is known; by the hosts' own timestamps every
record of clock-b comes before every record of clock-a.

Only clock-b's wall clock is set back (``FAKETIME_DONT_FAKE_MONOTONIC``: with the monotonic
clock faked too, Python's timed waits on it hang). libfaketime 0.9.10 (Debian 12) then fails
Python 3.11's ``time.sleep`` (``clock_nanosleep`` to an absolute monotonic time: EINVAL,
libfaketime issue 426), so clock-b's processes, the agent too, get a ``sitecustomize`` that
sleeps with ``select``'s relative timeout instead (:data:`SLEEP_BY_SELECT`).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

import pytest

from rlpulse.archive.audit import audit_runs
from rlpulse.archive.catalog import open_archive, query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.offline.diagnose import iso_utc
from rlpulse.schemas.topics import Topics
from tests.waiting import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

BEHIND_S = 5
"""How far clock-b's clock runs behind."""
TOLERANCE_NS = 500_000_000
"""How close each agent's estimate must come to the skew faketime made (0 for clock-a)."""
STEP = 3
TURNS = 6
TURN_GAP_S = 0.3
"""Real time between one turn's records and the next one's, at least."""
HOSTS = ("clock-a", "clock-b")
"""Turn ``n`` is logged by ``HOSTS[n % 2]``; clock-b's clock runs behind."""

SLEEP_BY_SELECT = """
import select, time

def _sleep(seconds):
    select.select([], [], [], seconds)

time.sleep = _sleep
"""
"""``sitecustomize.py`` of clock-b's processes: ``time.sleep`` that works under libfaketime."""

RANK = """
import sys, time
from pathlib import Path
from rlpulse.producers import EventLogger, Settings

bootstrap, prefix, spool, run_id, host, rank, step = sys.argv[1:8]
settings = Settings(
    bootstrap=bootstrap, prefix=prefix,
    producer={"spool_dir": Path(spool), "hostname": host},
)
logger = EventLogger(run_id, rank=int(rank), world_size=2, settings=settings)
for index in range(8):  # one at a time: the first wait for the agent to start and connect;
    logger.log({"warm_up": float(index)}, 0)  # the quick later ones make its estimate close
    left = logger.flush(60)
print("ready", left, time.time_ns(), flush=True)
for line in sys.stdin:
    turn = int(line)
    if turn < 0:
        break
    logger.log({"turn": float(turn)}, int(step))
    logger.log_record("WARNING", 30, "clocks", f"turn {turn}", step=int(step))
    print("logged", turn, flush=True)
print("closed", logger.close(60), flush=True)
"""


def faketime() -> str:
    """The path of Debian's ``faketime``; fails the test (with the fix) where it is missing."""
    found = shutil.which("faketime")
    assert found is not None, "faketime is not on PATH: apt-get install faketime"
    return found


class Rank:
    """One rank process of the run, standing for a host: told turns on its standard input."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        for stream, into in ((self.process.stdout, self.lines), (self.process.stderr, self.errors)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        for line in stream or ():
            into.append(line.strip())

    def said(self, prefix: str) -> str | None:
        """The first line it wrote that starts with ``prefix``."""
        return next((line for line in list(self.lines) if line.startswith(prefix)), None)

    def wait_said(self, prefix: str) -> str:
        """Wait for a line that starts with ``prefix``; the line."""
        wait_for(
            lambda: self.said(prefix) is not None or self.process.poll() is not None,
            f"a rank to say {prefix!r}",
            120.0,
        )
        line = self.said(prefix)
        assert line is not None, "\n".join(self.lines + self.errors)
        return line

    def tell(self, turn: int) -> None:
        """Send it a turn."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{turn}\n")
        self.process.stdin.flush()

    def close(self) -> None:
        """Tell it to close its logger and exit."""
        self.tell(-1)
        assert self.process.stdin is not None
        self.process.stdin.close()


def rlpulse(*args: str) -> str:
    """Run the command line; its standard output (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def turns(lines: list[str]) -> list[int]:
    """The turn numbers of ``turn <n>`` messages, in their order."""
    return [int(found) for found in re.findall(r"\bturn (\d+)", "\n".join(lines))]


def play_turns(kafka_bootstrap: str, topics: Topics, work: Path, run_id: str) -> None:
    """Both ranks log their turns in the real order; then close, their agents sending all."""
    skewed = [faketime(), "-f", f"-{BEHIND_S}s"]
    shim = work / "faketime-shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SLEEP_BY_SELECT)
    ranks = []
    for number, host in enumerate(HOSTS):
        env = dict(os.environ)
        if host == "clock-b":  # only the wall clock is off; sleeps that work (module docstring)
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), env.get("PYTHONPATH")]))
        arguments = [kafka_bootstrap, topics.prefix, str(work / f"spool-{host}"), run_id, host]
        command = [sys.executable, "-c", RANK, *arguments, str(number), str(STEP)]
        ranks.append(Rank([*skewed, *command] if host == "clock-b" else command, env))
    try:
        ready = [rank.wait_said("ready").split() for rank in ranks]
        assert [left for _ready, left, _at in ready] == ["0", "0"], "the warm-up is not sent"
        behind_ns = time.time_ns() - int(ready[1][2])
        assert behind_ns > (BEHIND_S - 1) * 10**9, "faketime did not set clock-b back"
        for turn in range(TURNS):
            teller = ranks[turn % 2]
            teller.tell(turn)
            teller.wait_said(f"logged {turn}")
            time.sleep(TURN_GAP_S)
        for rank in ranks:
            rank.close()
        for rank in ranks:
            assert rank.wait_said("closed") == "closed 0"
            assert rank.process.wait(timeout=60) == 0, "\n".join(rank.errors)
    finally:
        for rank in ranks:
            if rank.process.poll() is None:
                rank.process.kill()
                rank.process.wait()


def test_records_of_a_host_whose_clock_is_behind_come_in_the_real_order(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"clocks-{uuid.uuid4().hex[:8]}"
    play_turns(kafka_bootstrap, topics, tmp_path, run_id)
    root = tmp_path / "archive"
    turned = (
        "SELECT hostname, timestamp_ns, clock_offset_ns, clock_error_ns, "
        "coalesce(message, 'turn ' || CAST(metrics['turn'] AS INT)) AS said FROM ("
        "SELECT hostname, timestamp_ns, clock_offset_ns, clock_error_ns, NULL AS message, "
        "metrics FROM events WHERE run_id = ? AND step = ? UNION ALL "
        "SELECT hostname, timestamp_ns, clock_offset_ns, clock_error_ns, message, NULL "
        "FROM logs WHERE run_id = ? AND step = ?)"
    )
    archiver = ArchiverProcess(
        kafka_bootstrap, topics.prefix, root, tmp_path / "archiver.log",
        {"archive.roll_s": 1, "archive.audit": "false"},
    ).start()  # fmt: skip
    rows: list[tuple[Any, ...]] = []
    try:

        def archived() -> bool:
            nonlocal rows
            if root.exists():
                rows = query_archive(str(root), topics, turned, [run_id, STEP] * 2)[1]
            return len(rows) >= 2 * TURNS

        wait_for(archived, "the turns in the archive", 120.0, state=archiver.log_text)
    finally:
        archiver.stop()
    assert len(rows) == 2 * TURNS, rows

    # Every turn's records carry the agent's estimate: clock-b's is 5 s, clock-a's about 0;
    # each within half the time between turns, so that the clocks decide the order, not luck.
    for host, _stamp, offset_ns, error_ns, said in rows:
        skew_ns = BEHIND_S * 10**9 if host == "clock-b" else 0
        assert isinstance(offset_ns, int) and isinstance(error_ns, int), (host, said)
        assert abs(offset_ns - skew_ns) < TOLERANCE_NS, (host, said, offset_ns)
        assert error_ns < TURN_GAP_S * 10**9 / 2, (host, said, error_ns)
    measured = sorted({(host, offset / 1e6, error / 1e6) for host, _, offset, error, _ in rows})
    print(f"the turns' clock offsets (host, ms, ± ms): {measured}")
    by_raw = [
        str(said) for _host, _stamp, _offset, _error, said in sorted(rows, key=lambda r: r[1])
    ]
    assert turns(by_raw) == [1, 1, 3, 3, 5, 5, 0, 0, 2, 2, 4, 4]  # the hosts' own clocks

    shown = rlpulse("show", run_id, "--step", str(STEP), "--archive", str(root),
                    "--prefix", topics.prefix)  # fmt: skip
    assert turns(shown.splitlines()) == list(range(TURNS)), shown
    shown_b = re.search(r"clock-b (-?[\d.]+) ms", " ".join(shown.split()))
    assert shown_b is not None, shown
    assert abs(float(shown_b[1]) - BEHIND_S * 1000) < TOLERANCE_NS / 1e6, shown

    listed = tmp_path / "turns.csv"
    rlpulse("diagnose", "--run", run_id, "--grep", "^turn ", "--archive", str(root),
            "--prefix", topics.prefix, "--output", str(listed))  # fmt: skip
    with listed.open(newline="") as handle:
        records = list(csv.DictReader(handle))
    assert turns([record["message"] for record in records]) == list(range(TURNS))
    for record in records:  # shown on the brokers' clock, the host's own time beside it
        offset_ns = int(record["clock_offset_ns"])
        assert record["time"] == iso_utc(int(record["timestamp_ns"]) + offset_ns), record

    con = open_archive(str(root), topics)
    try:
        (audit,) = audit_runs(con, run_id)
    finally:
        con.close()
    clocks = {clock["hostname"]: clock["offset_ms"] for clock in audit.report["clocks"]}
    assert clocks.keys() == set(HOSTS), audit.report
    assert abs(clocks["clock-b"] - BEHIND_S * 1000) < TOLERANCE_NS / 1e6, clocks
    assert abs(clocks["clock-a"]) < TOLERANCE_NS / 1e6, clocks
    print(f"the audit's host clocks (ms behind the brokers): {clocks}")
    printed = rlpulse("audit", "--run", run_id, "--archive", str(root), "--prefix", topics.prefix)
    assert "0 lost, 0 duplicates" in printed and "clock-b" in printed, printed
