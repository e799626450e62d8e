"""The integrity audit: did every record of a run reach the archive, and only once.

Each producer (one trainer process of one run) numbers its records 0, 1, 2, ...
(``producer_id``, ``seq``), TrainerEvents and LogRecords alike; a process's rollout samples
are a producer of their own (``<producer id>.samples``), whose records are its chunks of
samples (one seq each, however many samples) and its chosen texts. From the archive, per
producer: how many records arrived, how many were duplicates (the same seq again: a retry
or a replay, harmless), and which seq ranges are missing between 0 and the last one seen
(lost). Records after a producer's last archived one cannot be told apart from records it
never wrote, so a lost tail shows only once a later record arrives. Per run: the steps
whose summary (latest revision) still misses ranks, and the dead letters keyed by the run.

Per host: its clock against the brokers', as the host's agent measured it from its own
deliveries and sent with the records (the ``clock_offset_ns`` and ``clock_error_ns`` columns,
:mod:`rlpulse.schemas.clock`): of the run's records from the host, the estimate with the
smallest error (of equal ones, the newest record's). The offset is what to add to the host's
time to get the brokers': how far the host's clock is behind (negative: ahead), the same
sign as ``HostClock.offset_ms`` always had. A host none of whose records carried an estimate
(an older release, an agent cut short before its first delivery report) has none: there is
one estimate of a host's clock, the one its readers order records by.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import duckdb

from rlpulse.archive.catalog import run_sql
from rlpulse.archive.tables import run_partition
from rlpulse.schemas.records import AuditReport, HostClock, SequenceGap

__all__ = ["ClockEstimate", "ProducerCount", "RunAudit", "audit_runs"]


@dataclass(frozen=True)
class ProducerCount:
    """What the archive holds of one producer."""

    run_id: str
    producer_id: str
    hostname: str
    rank: int
    received: int
    distinct: int
    last_seq: int

    @property
    def duplicates(self) -> int:
        """Records that arrived more than once (counted beyond the first)."""
        return self.received - self.distinct

    @property
    def lost(self) -> int:
        """Sequence numbers missing between 0 and the last one seen."""
        return self.last_seq + 1 - self.distinct


@dataclass(frozen=True)
class ClockEstimate:
    """One host's clock against the brokers': the best estimate its agent sent in the run."""

    hostname: str
    offset_ms: float
    """Add it to the host's time to get the brokers': the host's clock is this far behind."""
    error_ms: float
    """The bound of the offset (half the round trip of the delivery it comes from)."""
    records: int
    """The host's records of the run that carried an estimate."""

    def host_clock(self) -> HostClock:
        """The estimate as the report carries it (no error: the report's schema has none)."""
        return {"hostname": self.hostname, "offset_ms": self.offset_ms, "records": self.records}


@dataclass
class RunAudit:
    """The audit of one run: the report published, its producers and host clocks in detail."""

    report: AuditReport
    producers: list[ProducerCount] = field(default_factory=list)
    clocks: list[ClockEstimate] = field(default_factory=list)


def _where(run_id: str | None) -> tuple[str, list[object]]:
    if run_id is None:
        return "TRUE", []
    return "run = ? AND run_id = ?", [run_partition(run_id), run_id]


def audit_runs(con: duckdb.DuckDBPyConnection, run_id: str | None = None) -> list[RunAudit]:
    """Audit ``run_id`` (default: every run in the archive), from the views of ``con``."""
    where, parameters = _where(run_id)
    columns = (
        "run_id, producer_id, seq, hostname, rank, timestamp_ns, clock_offset_ns, clock_error_ns"
    )
    # A chunk of samples is one record (one seq) however many samples it holds: the samples
    # view has a row per sample, so each message's chunk is taken once.
    chunks = (
        f"SELECT {columns} FROM (SELECT DISTINCT {columns}, kafka_partition, kafka_offset "
        f"FROM samples WHERE {where})"
    )
    records = (
        f"SELECT {columns} FROM events WHERE {where} UNION ALL "
        f"SELECT {columns} FROM logs WHERE {where} UNION ALL {chunks} UNION ALL "
        f"SELECT {columns} FROM sample_texts WHERE {where}"
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE audit_records AS {records}", parameters * 4)
    _, producer_rows = run_sql(
        con,
        "SELECT run_id, producer_id, any_value(hostname), min(rank), count(*), "
        "count(DISTINCT seq), max(seq) FROM audit_records GROUP BY run_id, producer_id "
        "ORDER BY run_id, min(rank), producer_id",
    )
    _, gap_rows = run_sql(
        con,
        "SELECT run_id, producer_id, previous + 1, seq - 1 FROM ("
        " SELECT run_id, producer_id, seq, lag(seq, 1, -1) OVER ("
        "  PARTITION BY run_id, producer_id ORDER BY seq) AS previous"
        " FROM (SELECT DISTINCT run_id, producer_id, seq FROM audit_records))"
        " WHERE seq > previous + 1 ORDER BY run_id, producer_id, seq",
    )
    _, clock_rows = run_sql(
        con,
        "SELECT run_id, hostname, "
        "arg_min(clock_offset_ns, [clock_error_ns, -timestamp_ns]) / 1e6, "
        "min(clock_error_ns) / 1e6, count(*) FROM audit_records "
        "WHERE clock_offset_ns IS NOT NULL GROUP BY run_id, hostname ORDER BY run_id, hostname",
    )
    _, missing_rows = run_sql(
        con,
        "SELECT run_id, count(*) FILTER (WHERE len(missing) > 0) FROM ("
        " SELECT run_id, arg_max(missing_ranks, revision) AS missing FROM steps"
        f" WHERE {where} GROUP BY run_id, attempt, stage, step) GROUP BY run_id",
        parameters,
    )
    _, dead_rows = run_sql(
        con,
        f"SELECT run_id, count(*) FROM dead_letters WHERE {where} GROUP BY run_id",
        parameters,
    )
    con.execute("DROP TABLE audit_records")
    producers: dict[str, list[ProducerCount]] = {}
    hosts: dict[tuple[str, str], tuple[str, int]] = {}
    for run, producer, host, rank, received, distinct, last in producer_rows:
        count = ProducerCount(run, producer, host, rank, received, distinct, last)
        producers.setdefault(run, []).append(count)
        hosts[(run, producer)] = (host, rank)
    gaps: dict[str, list[SequenceGap]] = {}
    for run, producer, first, last in gap_rows:
        host, rank = hosts[(run, producer)]
        gaps.setdefault(run, []).append(
            {
                "producer_id": producer,
                "hostname": host,
                "rank": rank,
                "first_seq": first,
                "last_seq": last,
            }
        )
    clocks: dict[str, list[ClockEstimate]] = {}
    for run, host, offset, error, count in clock_rows:
        clocks.setdefault(run, []).append(ClockEstimate(host, offset, error, count))
    missing = {run: count for run, count in missing_rows}
    dead = {run: count for run, count in dead_rows}
    runs = sorted(set(producers) | set(missing) | set(dead))
    if run_id is not None and run_id not in runs:
        runs = [run_id]
    now = time.time_ns()
    audits = []
    for run in runs:
        counts = producers.get(run, [])
        lost = sum(count.lost for count in counts)
        report: AuditReport = {
            "run_id": run,
            "audited_ns": now,
            "ok": lost == 0,
            "producers": len(counts),
            "received": sum(count.received for count in counts),
            "lost": lost,
            "duplicates": sum(count.duplicates for count in counts),
            "gaps": gaps.get(run, []),
            "steps_with_missing_ranks": missing.get(run, 0),
            "dead_letters": dead.get(run, 0),
            "clocks": [clock.host_clock() for clock in clocks.get(run, [])],
            "summary": "",
        }
        report["summary"] = summary_of(report)
        audits.append(RunAudit(report, counts, clocks.get(run, [])))
    return audits


def summary_of(report: AuditReport) -> str:
    """The report in a few sentences."""
    run = report["run_id"]
    if not report["producers"]:
        return f"run {run}: no records in the archive."
    parts = [
        f"run {run}: {report['received']} records from {report['producers']} producers, "
        f"{report['lost']} lost, {report['duplicates']} duplicates."
    ]
    for gap in report["gaps"]:
        first, last = gap["first_seq"], gap["last_seq"]
        span = f"seq {first}" if first == last else f"seq {first}..{last}"
        parts.append(
            f"Producer {gap['producer_id']} (rank {gap['rank']} on {gap['hostname']}) "
            f"is missing {span}."
        )
    if report["steps_with_missing_ranks"]:
        parts.append(f"{report['steps_with_missing_ranks']} steps closed with missing ranks.")
    if report["dead_letters"]:
        parts.append(f"{report['dead_letters']} dead letters.")
    if report["clocks"]:
        spread = [clock["offset_ms"] for clock in report["clocks"]]
        parts.append(
            f"Host clocks behind the brokers' clock by {min(spread):.1f}..{max(spread):.1f} ms "
            "(as the hosts' agents measured them)."
        )
    return " ".join(parts)
