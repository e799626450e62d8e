"""The per-rank JSON Lines layout: RankLogWriter and the readers (no broker)."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.schemas.jsonl import (
    EVENT_FIELDS,
    MalformedLine,
    RankFile,
    RankLogWriter,
    RankRecord,
    list_rank_files,
    rank_log_path,
    read_json_lines,
    read_rank_file,
    read_rank_logs,
    world_sizes,
)


def records(items: list[RankRecord | MalformedLine]) -> list[RankRecord]:
    return [item for item in items if isinstance(item, RankRecord)]


def malformed(items: list[RankRecord | MalformedLine]) -> list[MalformedLine]:
    return [item for item in items if isinstance(item, MalformedLine)]


# -- writer ----------------------------------------------------------------------------------


def test_writer_writes_one_line_in_the_layout(tmp_path: Path) -> None:
    with RankLogWriter(tmp_path / "logs", "rollout", 0, hostname="node0") as writer:
        writer.write(120, "rollout", {"reward_mean": 2.41, "kl_divergence": 0.182}, timestamp_ns=5)
    assert writer.path == tmp_path / "logs" / "rollout_rank0.jsonl"
    assert writer.path.read_text() == (
        '{"stage":"rollout","step":120,"rank":0,"reward_mean":2.41,"kl_divergence":0.182,'
        f'"timestamp_ns":5,"hostname":"node0","pid":{os.getpid()}}}\n'
    )
    assert writer.closed


def test_non_finite_values_are_written_as_python_json_writes_them(tmp_path: Path) -> None:
    with RankLogWriter(tmp_path, "actor", 3) as writer:
        writer.write(1, "actor", {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 2})
    line = writer.path.read_text()
    assert '"a":NaN,"b":Infinity,"c":-Infinity,"d":2.0' in line
    fields = json.loads(line)
    assert math.isnan(fields["a"]) and fields["b"] == math.inf and fields["d"] == 2.0


def test_each_line_reaches_the_file_when_write_returns(tmp_path: Path) -> None:
    writer = RankLogWriter(tmp_path, "actor", 0)
    assert writer.path.exists() and writer.path.read_text() == ""  # the rank exists already
    writer.write(1, "actor", {"loss": 0.5})
    assert writer.path.read_text().count("\n") == 1  # not closed yet: line-buffered
    writer.write(2, "actor", {"loss": 0.4})
    assert writer.path.read_text().count("\n") == 2
    writer.close()
    writer.close()  # again: nothing happens


def test_a_second_writer_appends(tmp_path: Path) -> None:
    for step in (1, 2):
        with RankLogWriter(tmp_path, "actor", 0) as writer:
            writer.write(step, "actor", {"loss": 1.0})
    steps = [json.loads(line)["step"] for line in writer.path.read_text().splitlines()]
    assert steps == [1, 2]


def test_defaults_and_extras(tmp_path: Path) -> None:
    before = time.time_ns()
    with RankLogWriter(tmp_path, "actor", 1) as writer:
        writer.write(7, "ref", {"kl": 0.1}, epoch=2, note="warmup", hostname="elsewhere")
    fields = json.loads(writer.path.read_text())
    assert before <= fields["timestamp_ns"] <= time.time_ns()
    assert fields["hostname"] == "elsewhere"
    assert list(fields) == [
        "stage",
        "step",
        "rank",
        "kl",
        "timestamp_ns",
        "hostname",
        "pid",
        "epoch",
        "note",
    ]
    assert fields["pid"] == os.getpid()
    assert fields["stage"] == "ref"  # a component may log several stages
    with RankLogWriter(tmp_path, "actor", 2) as writer:
        writer.write(7, "actor", {})
    assert json.loads(writer.path.read_text())["hostname"] == socket.gethostname()


@pytest.mark.parametrize(
    ("metrics", "extra", "message"),
    [
        ({"step": 1.0}, {}, "cannot be a metric name"),
        ({"timestamp_ns": 1.0}, {}, "cannot be a metric name"),
        ({"loss": "0.5"}, {}, "must be a number"),
        ({"loss": None}, {}, "must be a number"),
        ({"loss": 1.0}, {"rank": 3}, "rank is the writer's"),
        ({"loss": 1.0}, {"loss": 2}, "repeat metric names"),
        ({"loss": 1.0}, {"timestamp_ns": 1.5}, "timestamp_ns must be an int"),
    ],
)
def test_a_refused_write_writes_nothing(
    tmp_path: Path, metrics: dict[str, object], extra: dict[str, object], message: str
) -> None:
    with RankLogWriter(tmp_path, "actor", 0) as writer, pytest.raises(ValueError, match=message):
        writer.write(1, "actor", metrics, **extra)  # type: ignore[arg-type]
    assert writer.path.read_text() == ""


@pytest.mark.parametrize(("component", "rank"), [("a/b", 0), ("", 0), ("c", -1), ("c", True)])
def test_bad_writer_arguments(tmp_path: Path, component: str, rank: int) -> None:
    with pytest.raises(ValueError):
        RankLogWriter(tmp_path, component, rank)


@pytest.mark.parametrize(("step", "stage"), [(-1, "actor"), (1.0, "actor"), (1, ""), (1, "a|b")])
def test_bad_write_arguments(tmp_path: Path, step: int, stage: str) -> None:
    with RankLogWriter(tmp_path, "actor", 0) as writer, pytest.raises(ValueError):
        writer.write(step, stage, {})


# -- reader ----------------------------------------------------------------------------------


def test_rank_files_are_listed_sorted_and_counted(tmp_path: Path) -> None:
    for name in ("rollout_rank1", "rollout_rank0", "actor_rank0", "ref_model_rank10"):
        (tmp_path / f"{name}.jsonl").write_text("")
    (tmp_path / "notes.jsonl").write_text("")
    (tmp_path / "rollout_rank2.json").write_text("")
    (tmp_path / "x_rank3.jsonl").mkdir()
    files = list_rank_files(tmp_path)
    assert [(f.component, f.rank) for f in files] == [
        ("actor", 0),
        ("ref_model", 10),
        ("rollout", 0),
        ("rollout", 1),
    ]
    assert files[0].path == rank_log_path(tmp_path, "actor", 0)
    assert world_sizes(files) == {"actor": 1, "ref_model": 1, "rollout": 2}


def test_plain_rank_files_are_the_trainer_component(tmp_path: Path) -> None:
    """The seed's naming: rank0.jsonl and rollout_rank1.jsonl side by side."""
    (tmp_path / "rank0.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (tmp_path / "rank1.jsonl").write_text('{"step": 1, "loss": 0.7}\n')
    (tmp_path / "rollout_rank1.jsonl").write_text("")
    files = list_rank_files(tmp_path)
    assert [(f.component, f.rank, f.path.name) for f in files] == [
        ("rollout", 1, "rollout_rank1.jsonl"),
        ("trainer", 0, "rank0.jsonl"),
        ("trainer", 1, "rank1.jsonl"),
    ]
    records = [r for r in read_rank_logs(tmp_path) if isinstance(r, RankRecord)]
    assert {(r.component, r.rank, r.stage, r.metrics["loss"]) for r in records} == {
        ("trainer", 0, "trainer", 0.5),
        ("trainer", 1, "trainer", 0.7),
    }


def test_the_writer_refuses_what_the_worker_would(tmp_path: Path) -> None:
    refused = pytest.raises(ValueError, match=r"contains '\|'")
    with RankLogWriter(tmp_path, "actor", 0) as writer, refused:
        writer.write(1, "a|b", {"loss": 1.0})
    assert writer.path.read_text() == ""


def test_two_files_of_one_rank_are_refused(tmp_path: Path) -> None:
    (tmp_path / "actor_rank1.jsonl").write_text("")
    (tmp_path / "actor_rank01.jsonl").write_text("")
    with pytest.raises(ValueError, match="both rank 1 of 'actor'"):
        list_rank_files(tmp_path)
    with pytest.raises(NotADirectoryError):
        list_rank_files(tmp_path / "actor_rank1.jsonl")


def test_lines_are_read_with_file_and_line_number(tmp_path: Path) -> None:
    path = tmp_path / "actor_rank2.jsonl"
    path.write_text(
        '{"stage":"actor","step":1,"rank":2,"kl":0.1,"epoch":3,"note":"x","ok":true,'
        '"timestamp_ns":10,"hostname":"h","pid":7}\n'
        "\n"
        '{"step":2,"kl":NaN}\n'
    )
    first, second = records(list(read_rank_file(RankFile(path, "actor", 2))))
    assert (first.path, first.line, first.component, first.rank) == (path, 1, "actor", 2)
    assert (first.stage, first.step, first.timestamp_ns) == ("actor", 1, 10)
    assert first.metrics == {"kl": 0.1, "epoch": 3.0}  # numbers that are not event fields
    assert first.fields["note"] == "x" and first.fields["ok"] is True
    assert second.line == 3  # the blank line is skipped but counted
    assert second.stage == "actor" and second.fields["rank"] == 2  # defaults
    assert second.timestamp_ns is None and math.isnan(second.metrics["kl"])
    assert first.attempt is None

    event = first.to_event("run-1", world_size=4, attempt=2)
    assert event["run_id"] == "run-1" and event["attempt"] == 2 and event["world_size"] == 4
    assert (event["stage"], event["step"], event["rank"]) == ("actor", 1, 2)
    assert event["metrics"] == {"kl": 0.1, "epoch": 3.0}
    assert (event["producer_id"], event["seq"]) == (str(path), 1)
    assert (event["hostname"], event["pid"], event["timestamp_ns"]) == ("h", 7, 10)
    assert second.to_event("run-1", 4)["timestamp_ns"] == 0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"stage":"actor","step":1,"kl":0.1', "not JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('"text"', "expected a JSON object, got str"),
        ('{"stage":"actor","kl":0.1}', "step must be an int >= 0, got None"),
        ('{"stage":"actor","step":-1}', "step must be an int >= 0, got -1"),
        ('{"stage":"actor","step":1.5}', "step must be an int >= 0, got 1.5"),
        ('{"stage":"actor","step":true}', "step must be an int >= 0, got True"),
        ('{"stage":"a|b","step":1}', "stage 'a|b' contains '|'"),
        ('{"stage":"","step":1}', "stage '' is not a non-empty string"),
        ('{"stage":"actor","step":1,"rank":4}', "rank 4 in the file of rank 2"),
        ('{"stage":"actor","step":1,"timestamp_ns":"now"}', "timestamp_ns must be an int"),
    ],
)
def test_malformed_lines_are_reported_in_place(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "actor_rank2.jsonl"
    path.write_text(f'{{"stage":"actor","step":0}}\n{line}\n{{"stage":"actor","step":5}}\n')
    items = list(read_rank_file(RankFile(path, "actor", 2)))
    assert [type(item) for item in items] == [RankRecord, MalformedLine, RankRecord]
    problem = malformed(items)[0]
    assert (problem.path, problem.line) == (path, 2)
    assert reason in problem.reason
    assert str(problem).startswith(f"{path}:2: ")


def test_undecodable_bytes_are_a_malformed_line(tmp_path: Path) -> None:
    path = tmp_path / "actor_rank0.jsonl"
    path.write_bytes(b'{"step":1}\n\xff\xfe{"step":2}\n')
    items = list(read_json_lines(path))
    assert items[0] == (1, {"step": 1})
    assert isinstance(items[1], MalformedLine) and "not UTF-8" in items[1].reason


def test_rank_files_merge_by_timestamp(tmp_path: Path) -> None:
    stamps = {  # (component, rank) -> [(step, timestamp_ns)]
        ("rollout", 0): [(1, 10), (2, 40)],
        ("rollout", 1): [(1, 12), (2, 41)],
        ("actor", 0): [(1, 20), (2, 45)],
        ("actor", 1): [(1, 19), (2, 45)],
    }
    for (component, rank), lines in stamps.items():
        with RankLogWriter(tmp_path, component, rank) as writer:
            for step, ts in lines:
                writer.write(step, component, {"x": 1.0}, timestamp_ns=ts)
    merged = records(list(read_rank_logs(tmp_path)))
    order = [(r.timestamp_ns, r.component, r.rank) for r in merged]
    assert order == [
        (10, "rollout", 0),
        (12, "rollout", 1),
        (19, "actor", 1),
        (20, "actor", 0),
        (40, "rollout", 0),
        (41, "rollout", 1),
        (45, "actor", 0),  # a tie: then by step, rank, component
        (45, "actor", 1),
    ]


def test_files_without_timestamps_merge_step_by_step_in_file_order(tmp_path: Path) -> None:
    steps = {0: [1, 2, 3, 2, 3], 1: [1, 2, 3, 2, 3]}  # both ranks resume at step 2
    for rank, numbers in steps.items():
        lines = "".join(json.dumps({"stage": "actor", "step": s}) + "\n" for s in numbers)
        (tmp_path / f"actor_rank{rank}.jsonl").write_text(lines + "not json\n")
    items = list(read_rank_logs(tmp_path))
    got = [(r.step, r.rank) for r in records(items)]
    assert got == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    for rank in (0, 1):  # each file's own order is kept
        assert [r.line for r in records(items) if r.rank == rank] == [1, 2, 3, 4, 5]
    assert [(m.path.name, m.line) for m in malformed(items)] == [
        ("actor_rank0.jsonl", 6),
        ("actor_rank1.jsonl", 6),
    ]


_names = st.text(min_size=1, max_size=12).filter(lambda name: name not in EVENT_FIELDS)


@settings(max_examples=60, deadline=None)
@given(
    metrics=st.dictionaries(_names, st.floats(), max_size=6),
    step=st.integers(0, 2**62),
    stage=st.text(min_size=1, max_size=8).filter(lambda s: "|" not in s),
)
def test_what_is_written_reads_back(
    tmp_path_factory: pytest.TempPathFactory, metrics: dict[str, float], step: int, stage: str
) -> None:
    directory = tmp_path_factory.mktemp("layout")
    with RankLogWriter(directory, "comp", 3) as writer:
        writer.write(step, stage, metrics, timestamp_ns=123)
    (record,) = records(list(read_rank_logs(directory)))
    assert (record.stage, record.step, record.rank, record.timestamp_ns) == (stage, step, 3, 123)
    assert list(record.metrics) == list(metrics)
    for name, value in metrics.items():
        read = record.metrics[name]
        assert (math.isnan(read) and math.isnan(value)) or read == value
