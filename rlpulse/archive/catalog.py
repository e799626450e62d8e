"""The archive as SQL: a DuckDB connection with one view per table.

Views: ``events``, ``logs``, ``steps``, ``commands``, ``acks``, ``verdicts``, ``audits``
(the records, with their Kafka coordinates) and ``dead_letters`` (``<prefix>.dlq`` as it
is, plus every message the archiver could not decode). Every view has the partition columns ``date``
(UTC, ``YYYY-MM-DD``, from the broker's timestamp) and ``run`` (the run id, cut when very
long), whose filters decide which files are read, and ``time``: the record's own time as a
UTC ``TIMESTAMP`` (``timestamp_ns``, ``emitted_ns``, ...). The session time zone is UTC, so
``time > now() - INTERVAL 1 HOUR`` means what it says.

``time`` is the host's clock. Records of several hosts are put in order by
:data:`CORRECTED_NS`, their time on the brokers' clock (``timestamp_ns`` plus the
``clock_offset_ns`` the host's agent sent with them); :func:`corrected_window` selects by it.

Each view is a pyarrow dataset registered with DuckDB, so local directories and any
pyarrow filesystem read the same way (DuckDB needs no extension for S3), and filters on
``run``, ``date`` and the columns' statistics reach the scan. Files are discovered when the
connection is opened: the archive files that :class:`ArchiveStore` lists by name (an object
store's zero-byte directory markers and other strays are never read).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from rlpulse.archive.exceptions import ArchiveError, QueryError
from rlpulse.archive.store import ArchiveStore
from rlpulse.archive.tables import PARTITION_COLUMNS, Table, day_of, tables_of
from rlpulse.schemas.codec import Codec, default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ArchiveSettings

__all__ = [
    "CLOCK_SLACK_MS",
    "CORRECTED_NS",
    "CORRECTED_TIME",
    "VIEWS",
    "corrected_window",
    "open_archive",
    "query_archive",
    "register_logs",
    "require_archive",
    "run_sql",
    "table_dataset",
]

VIEWS: Final = (
    "events", "logs", "steps", "commands", "acks", "verdicts", "audits", "samples",
    "sample_texts", "dead_letters",
)  # fmt: skip
_VANISHED: Final = ("No such file", "during GetObject operation")
"""What a read of a file deleted after the listing fails with: locally; on S3, whether the
object was gone at the request (``NO_SUCH_KEY``) or deleted while it streamed (S3Proxy then
ends the response early: ``INTERNAL_FAILURE ... Failed to flush response stream``)."""
_QUERY_ATTEMPTS: Final = 3
CORRECTED_NS: Final = "(timestamp_ns + coalesce(clock_offset_ns, 0))"
"""SQL: an event's or log record's time on the brokers' clock, in ns: its host's
``timestamp_ns`` plus the offset the host's agent sent with it (the host's own time where none
came). The one order of records from several hosts."""
CORRECTED_TIME: Final = f"make_timestamp({CORRECTED_NS} // 1000)"
"""SQL: :data:`CORRECTED_NS` as a UTC ``TIMESTAMP``: the views' ``time`` on the brokers' clock."""
CLOCK_SLACK_MS: Final = 3_600_000
"""How far :func:`corrected_window` looks beyond its bounds in the host's own time and in the
``date`` partition (the broker's day): an hour. A record whose host's clock is further off
the brokers', or that reached the broker later than that, is not found by a window."""
_NS_PER_MS: Final = 1_000_000
_HIVE: Final = ds.partitioning(pa.schema(list(PARTITION_COLUMNS)), flavor="hive")


def table_dataset(
    store: ArchiveStore, table: Table, dictionary_columns: tuple[str, ...] = ()
) -> ds.Dataset | pa.Table:
    """The archive's files of ``table`` as one pyarrow dataset (with ``date`` and ``run``).

    ``dictionary_columns``: columns read dictionary-encoded (``metrics.key_value.key``: a
    map's keys, each name once per file instead of once per row). No files: an empty table.
    """
    schema = pa.schema([*table.schema, *PARTITION_COLUMNS])
    paths = sorted(path for path, _name in store.files(table.topic))
    if not paths:
        return schema.empty_table()
    options = ds.ParquetReadOptions(dictionary_columns=list(dictionary_columns))
    try:
        return ds.dataset(
            paths,
            filesystem=store.fs,
            format=ds.ParquetFileFormat(read_options=options),
            partitioning=_HIVE,
            partition_base_dir=store.path(table.topic),
            schema=schema,
        )
    except OSError as exc:
        raise ArchiveError(f"cannot read the archive at {store.root}: {exc}") from exc


def corrected_window(
    low_ns: int | None, high_ns: int | None, partitioned: bool = True
) -> tuple[list[str], list[Any]]:
    """SQL terms (joined with AND, they select by time) and their parameters.

    :data:`CORRECTED_NS` within ``[low_ns, high_ns]`` (None: open on that side), for the
    events or logs view. Each bound is also set, :data:`CLOCK_SLACK_MS` wider, on
    ``timestamp_ns`` and (``partitioned``: a view over the archive's files) on ``date``: those
    the scan prunes files and row groups by.
    """
    terms: list[str] = []
    parameters: list[Any] = []
    for bound_ns, compare, slack_ms in (
        (low_ns, ">=", -CLOCK_SLACK_MS),
        (high_ns, "<=", CLOCK_SLACK_MS),
    ):
        if bound_ns is None:
            continue
        terms += [f"{CORRECTED_NS} {compare} ?", f"timestamp_ns {compare} ?"]
        parameters += [bound_ns, bound_ns + slack_ms * _NS_PER_MS]
        if partitioned:
            terms.append(f"date {compare} ?")
            parameters.append(day_of(bound_ns // _NS_PER_MS + slack_ms))
    return terms, parameters


def _time(column: str) -> str:
    return f"make_timestamp({column} // 1000) AS time"


def require_archive(root: str, options: ArchiveSettings | None = None) -> None:
    """Raise :class:`ArchiveError` unless an archive directory is at ``root``.

    Readers call it: a mistyped root would otherwise read as an empty archive. ``options``:
    the ``archive`` settings (an ``s3://`` root's endpoint and credentials).
    """
    if not ArchiveStore(root, options).exists():
        raise ArchiveError(f"no archive at {root}: no such directory (see --archive, archive.root)")


def open_archive(
    root: str,
    topics: Topics,
    codec: Codec | None = None,
    options: ArchiveSettings | None = None,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection over the archive at ``root`` for the topics of ``topics``.

    ``options``: the ``archive`` settings (an ``s3://`` root's endpoint and credentials).
    """
    store = ArchiveStore(root, options)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    tables = tables_of(topics, codec or default_codec())
    for table in tables.values():
        con.register(f"_{table.name}", table_dataset(store, table))
    undecodable = []
    for table in tables.values():
        if table.record is None:
            continue
        con.execute(
            f"CREATE VIEW {table.name} AS SELECT * EXCLUDE (decode_error, raw_value), "
            f"{_time(table.time_field or 'kafka_timestamp_ms * 1000000')} "
            f"FROM _{table.name} WHERE decode_error IS NULL"
        )
        undecodable.append(
            "SELECT CASE WHEN run = '_' THEN NULL ELSE run END AS run_id, "
            "'undecodable in the archive: ' || decode_error AS reason, "
            f"'{table.topic}/' || kafka_partition || '/' || kafka_offset AS source, "
            "CAST(NULL AS BLOB) AS key, raw_value AS value, kafka_partition, kafka_offset, "
            f"kafka_timestamp_ms, kafka_timestamp_type, date, run, "
            f"{_time('kafka_timestamp_ms * 1000000')} "
            f"FROM _{table.name} WHERE decode_error IS NOT NULL"
        )
    con.execute(
        "CREATE VIEW dead_letters AS SELECT * EXCLUDE (date, run), date, run, "
        f"{_time('kafka_timestamp_ms * 1000000')} FROM _dead_letters UNION ALL BY NAME "
        + " UNION ALL BY NAME ".join(undecodable)
    )
    return con


def register_logs(con: duckdb.DuckDBPyConnection, records: pa.Table) -> None:
    """Make ``records`` (rows of the logs table) the ``logs`` view of ``con``."""
    con.register("_logs_given", records)
    con.execute(
        f"CREATE OR REPLACE VIEW logs AS SELECT *, {_time('timestamp_ns')} FROM _logs_given"
    )


def run_sql(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    parameters: Mapping[str, Any] | list[Any] | None = None,
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql``; its column names and rows. Bad SQL raises :class:`QueryError`."""
    try:
        result = con.execute(sql, parameters) if parameters is not None else con.execute(sql)
        columns = [column[0] for column in result.description or []]
        return columns, result.fetchall()
    except duckdb.Error as exc:
        raise QueryError(str(exc).strip()) from None


def query_archive(
    root: str,
    topics: Topics,
    sql: str,
    parameters: list[Any] | None = None,
    options: ArchiveSettings | None = None,
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Open the archive, run ``sql``, close; retried (listing afresh) when a file vanished.

    Retention (or a crash recovery) may delete a file between the listing and the read, or
    while it is read; a file that stays unreadable fails the last attempt with its error.
    """
    for attempt in range(1, _QUERY_ATTEMPTS + 1):
        con = open_archive(root, topics, options=options)
        try:
            return run_sql(con, sql, parameters)
        except QueryError as exc:
            if attempt == _QUERY_ATTEMPTS or not any(gone in str(exc) for gone in _VANISHED):
                raise
        finally:
            con.close()
    raise AssertionError("unreachable")
