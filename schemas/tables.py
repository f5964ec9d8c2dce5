"""SQLAlchemy Core tables for the store.  No I/O here: only ``store/`` issues SQL.

All timestamps are BIGINT **milliseconds** since the epoch: integers index and compare exactly
(a float second would make ``(series_id, ts)`` keys depend on rounding), and milliseconds are the
resolution Prometheus itself keeps.

Other packages add their tables (alert states, probe results, reports...) to the same
:data:`metadata`, so that ``Store.migrations.apply()`` creates everything in one call.  Bump
:data:`SCHEMA_VERSION` when an existing table changes shape.
"""

from __future__ import annotations

from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    Table,
    Text,
    UniqueConstraint,
    event,
)

#: 2: ``samples`` (one row per sample) replaced by ``sample_chunks``; ``Store.migrations.apply``
#: converts a version 1 database.
#: 3: flushes append to ``sample_log``, which readers merge (an older tritonwatch would not).
#: 4: compaction compresses ``sample_chunks.data`` (``store.chunks``), which an older
#: tritonwatch could not read; ``store.migrate.recompress_chunks`` upgrades version 3.
#: 5: rollups stored as compressed column chunks (``rollup_chunks_5m``/``_1h``) instead of a
#: row per bucket (``rollups_5m``/``_1h``); ``store.migrate.rollup_rows_to_chunks`` converts.
#: 6: compacted span chunks may refer to a timestamp column stored once in
#: ``chunk_timestamps`` (``store.chunks``), which an older tritonwatch could not read; the
#: upgrade only creates the table.
#: 7: ``sample_log`` keyed ``(seq, target, name, start_ms)``, each flush listed in
#: ``sample_log_flushes`` (readers find a window's log rows through it; an older writer would
#: not list its flushes); ``store.migrate.rekey_sample_log`` converts.
#: 8: ``sample_log`` rows may list their series ids as runs, which 7 would drop as damaged;
#: nothing to convert.
#: 9: compact ``sample_log`` rows may hold their values as int32s, which 8 would drop as
#: damaged; nothing to convert.
#: 10: ``sample_log`` rows name their target and metric by an ``owner`` id
#: (``sample_log_owners``) instead of two texts; ``store.migrate.own_sample_log`` converts.
SCHEMA_VERSION = 10

# Named constraints keep future migrations (ALTER ... DROP CONSTRAINT name) portable.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only makes ``INTEGER PRIMARY KEY`` an alias of the rowid (and so auto-incrementing);
# ``BIGINT PRIMARY KEY`` would be a plain column there.  PostgreSQL gets a real BIGINT.
SeriesId = BigInteger().with_variant(Integer(), "sqlite")

series = Table(
    "series",
    metadata,
    Column("id", SeriesId, primary_key=True, autoincrement=True),
    Column("target", Text, nullable=False),
    Column("name", Text, nullable=False),
    # schemas.samples.labels_json(): sorted, compact JSON, so equal label sets are equal text.
    Column("labels", Text, nullable=False),
    # When a writer last resolved this series (ms).  Retention only deletes empty series not
    # resolved for longer than raw retention, so a writer that has just looked an id up never
    # has it deleted under it (see store.maintenance).
    Column("resolved_at", BigInteger, nullable=False),
    UniqueConstraint("target", "name", "labels"),
    # Queries by name across all targets; (target, name, ...) lookups use the unique index.
    Index(None, "name"),
)

# Raw samples, stored as per-series chunks: one row holds many samples of one series (see
# store/chunks.py for the encoding and the merge rule).  A row per sample cost more than a
# microsecond of CPU per sample on both backends (binding, and a B-tree entry per sample).
# ``seq`` orders the writes (the last write of a (series, ts) wins when chunks overlap) and
# makes every flush's rows new keys: a flush never overwrites a chunk, so no sample of an older
# or compacted chunk can be lost to a newer one that starts at the same time.  Chunks never
# cross an aligned hour, so ``start_ms`` bounds a range query from both sides and no index on
# ``end_ms`` is needed.  ``data`` comes last: SQLite reads the small columns of a row without
# touching a large blob's overflow pages.
#
# No FOREIGN KEY to series: PostgreSQL would check it per inserted row on the hot path, and the
# store is the only writer.  Retention removes series rows only once they hold no data.
sample_chunks = Table(
    "sample_chunks",
    metadata,
    Column("series_id", SeriesId, nullable=False),
    Column("start_ms", BigInteger, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("end_ms", BigInteger, nullable=False),
    Column("n", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("series_id", "start_ms", "seq"),
    sqlite_with_rowid=False,
)

# Timestamp columns shared by the compacted chunks of the series scraped at the same instants
# (store/chunks.py, "Shared timestamps"): a target's series all have the same, and they were
# 0.7 of the 1.7 bytes a compacted sample took.  Keyed by the column's first timestamp (which
# is its chunks' ``start_ms``) and a hash of its content; retention deletes those that end
# before its cutoff (a range scan), after the chunks referring to them.
chunk_timestamps = Table(
    "chunk_timestamps",
    metadata,
    Column("start_ms", BigInteger, nullable=False),
    Column("key", BigInteger, nullable=False),
    Column("end_ms", BigInteger, nullable=False),
    Column("n", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("start_ms", "key"),
    sqlite_with_rowid=False,
)

# The flushes' append-only log (see store/samplelog.py): one row per target, metric name and
# hour per flush, holding that flush's chunks of those series packed into one blob.  A flush
# thus writes a row per name instead of a small row per series scattered over the chunks'
# B-tree, which on SQLite rewrote a 4 KB page for every 16-byte sample at a fleet's 15 s
# interval.  Maintenance moves each hour of the log into ``sample_chunks`` (compressed, a chunk
# per series) 5 minutes after it ends; readers merge both.  Keyed by ``seq`` first, so that a
# flush's rows are appended: keyed ``(target, name, seq)`` (schemas 3 to 6), each of a fleet's
# flushes inserted into every (target, name) range of the key, rewriting nearly all of its
# pages (at 300 targets, 51 B written per sample after a move, 165 B five minutes later).
# Readers find the flushes overlapping their window in ``sample_log_flushes``, then the rows
# by key.  A row names its target and metric by ``owner`` (``sample_log_owners``): the two
# texts (schemas 7 to 9) were some 40 of a row's bytes, a row being ten samples or so, and
# every byte of the log is written twice (WAL, checkpoint) and again when it moves.
sample_log = Table(
    "sample_log",
    metadata,
    Column("owner", SeriesId, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("start_ms", BigInteger, nullable=False),
    Column("end_ms", BigInteger, nullable=False),
    Column("n", Integer, nullable=False),  # samples
    Column("data", LargeBinary, nullable=False),
    # ``start_ms``: a flush writes a row per hour it holds samples of (moved an hour at a time).
    PrimaryKeyConstraint("seq", "owner", "start_ms"),
    # On SQLite the rows live in the key's B-tree (appended too, the key leading with seq):
    # a rowid table kept each row's key twice, in the rows and in the index.
    sqlite_with_rowid=False,
)

# The (target, metric name) pairs the log's rows belong to, by id (``sample_log.owner``).
# ``resolved_at`` as in ``series``: writers refresh it when they look an owner up (a layout's
# names, every ``RetentionConfig.series_cache_ttl``), and retention deletes only owners left
# without series that no writer has resolved for longer than raw retention.
sample_log_owners = Table(
    "sample_log_owners",
    metadata,
    Column("id", SeriesId, primary_key=True, autoincrement=True),
    Column("target", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("resolved_at", BigInteger, nullable=False),
    UniqueConstraint("target", "name"),
)

# One row per flush with rows in ``sample_log``: its ``seq`` and the oldest and newest sample
# it wrote.  A read of a window takes the flushes overlapping it here (a few dozen rows), then
# their log rows by ``(seq, target, name)``; the move into chunks deletes a flush's row once
# its last log row is gone.
sample_log_flushes = Table(
    "sample_log_flushes",
    metadata,
    Column("seq", SeriesId, primary_key=True, autoincrement=False),  # the rowid on SQLite
    Column("start_ms", BigInteger, nullable=False),
    Column("end_ms", BigInteger, nullable=False),
)

# PostgreSQL would try to compress every row's blob (pglz) before moving it out of line;
# float64 samples do not compress, and compressed chunks are compressed already, so that CPU
# is wasted (on the hot path, for the log).
for _table in ("sample_log", "sample_chunks", "chunk_timestamps"):
    event.listen(
        {"sample_log": sample_log, "sample_chunks": sample_chunks,
         "chunk_timestamps": chunk_timestamps}[_table],
        "after_create",
        DDL(  # type: ignore[no-untyped-call]  # SQLAlchemy's DDL has no annotations
            f"ALTER TABLE {_table} ALTER COLUMN data SET STORAGE EXTERNAL"
        ).execute_if(
            dialect="postgresql"
        ),
    )

# Write sequence of sample chunks on PostgreSQL (flushes of several processes take numbers
# without waiting for each other).  SQLite has no sequences: there a counter in ``meta``
# serves, its writers being serialised anyway.  create_all() skips it on SQLite.
sample_chunks_seq = Sequence("sample_chunks_seq", metadata=metadata)


def _rollup_table(name: str) -> Table:
    # A rollup chunk: one series' rollup rows (one per bucket: min/max/sum/count/last, all
    # composable, so 1 h rows are built from 5 m rows and query buckets from either) of one
    # aligned window, column-wise and compressed (store/rollup_chunks.py).  A row per bucket
    # was 60 bytes on disk, more than the raw samples it summarised.  Keyed and merged as
    # sample_chunks are: ``seq`` orders the writes, the last write of a bucket wins.
    table = Table(
        name,
        metadata,
        Column("series_id", SeriesId, nullable=False),
        Column("start_ms", BigInteger, nullable=False),
        Column("seq", BigInteger, nullable=False),
        Column("end_ms", BigInteger, nullable=False),
        Column("n", Integer, nullable=False),
        Column("data", LargeBinary, nullable=False),
        PrimaryKeyConstraint("series_id", "start_ms", "seq"),
        sqlite_with_rowid=False,
    )
    event.listen(table, "after_create", DDL(  # type: ignore[no-untyped-call]
        f"ALTER TABLE {name} ALTER COLUMN data SET STORAGE EXTERNAL"
    ).execute_if(dialect="postgresql"))
    return table


rollup_chunks_5m = _rollup_table("rollup_chunks_5m")
rollup_chunks_1h = _rollup_table("rollup_chunks_1h")
#: Schema 4's rollup tables (a row per series and bucket), converted by store.migrate.
LEGACY_ROLLUP_TABLES = {"rollups_5m": rollup_chunks_5m, "rollups_1h": rollup_chunks_1h}

def _health_table(name: str, *key: str) -> Table:
    # One outcome of a scrape (or NVML read, probe run) per row: schemas.samples.TargetHealth.
    return Table(
        name,
        metadata,
        Column("target", Text, nullable=False),
        Column("source", Text, nullable=False),
        Column("ts", BigInteger, nullable=False),
        Column("up", Boolean, nullable=False),
        Column("duration_s", Double, nullable=False),
        Column("samples", BigInteger, nullable=False),
        Column("error", Text, nullable=True),
        PrimaryKeyConstraint(*key),
    )


# The latest outcome per (target, source), like Prometheus ``up`` plus scrape metadata.
target_health = _health_table("target_health", "target", "source")
# Only up/down transitions (and each source's first report): a few rows a day, enough for
# "when did this target go down" without storing every scrape.
target_health_log = _health_table("target_health_log", "target", "source", "ts")

model_configs = Table(
    "model_configs",
    metadata,
    Column("target", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("fetched_at", BigInteger, nullable=False),
    # JSON text rather than a JSON column type: identical on both backends, and nothing
    # queries inside it.
    Column("config", Text, nullable=False),
    PrimaryKeyConstraint("target", "model"),
)

# Small key/value facts about the database itself: schema version, rollup watermarks.
meta = Table(
    "meta",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)

# One row per synthetic probe request (collector/probes).  Durations in seconds; NULL where a
# value does not apply (no ITL for a one-token answer, no TTFT for a failed request).
probe_results = Table(
    "probe_results",
    metadata,
    Column("id", SeriesId, primary_key=True, autoincrement=True),
    Column("probe", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("protocol", Text, nullable=False),
    Column("ts", BigInteger, nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("ttft_s", Double, nullable=True),
    Column("itl_s", Double, nullable=True),
    Column("tpot_s", Double, nullable=True),
    Column("e2e_s", Double, nullable=True),
    Column("tokens_per_s", Double, nullable=True),
    Column("error_kind", Text, nullable=True),
    Column("error_code", Text, nullable=True),
    Column("error_message", Text, nullable=True),
    Column("request_id", Text, nullable=False),
    Index(None, "probe", "ts"),
    Index(None, "ts"),
)

# --- alerts (alerts/engine.py through store/alerts.py) --------------------------------------

# The engine's state of every alert instance that is pending, firing, or resolved within the
# resend retention (15 min): what a restart needs so that it neither re-pages (fired_at is the
# startsAt Alertmanager deduplicates on) nor loses a resolve.  Labels and annotations are
# canonical JSON; ``value`` is NULL for NaN (SQLite cannot store NaN).
alert_states = Table(
    "alert_states",
    metadata,
    Column("fingerprint", Text, primary_key=True),
    Column("rule", Text, nullable=False),
    Column("labels", Text, nullable=False),
    Column("annotations", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("active_since", BigInteger, nullable=False),
    Column("fired_at", BigInteger, nullable=True),
    Column("resolved_at", BigInteger, nullable=True),
    Column("last_true_at", BigInteger, nullable=False),
    # First evaluation at which a firing alert's condition was false (Prometheus's
    # KeepFiringSince); keep_firing_for counts from here.  NULL while the condition holds.
    Column("keep_firing_since", BigInteger, nullable=True),
    Column("last_sent_at", BigInteger, nullable=True),
    Column("value", Double, nullable=True),
    Column("updated_at", BigInteger, nullable=False),
)

# Alert history: firing/resolved transitions of our engine (source "engine") and alerts received
# from Alertmanager webhooks (source "alertmanager:<receiver>").  Append-only; read by time range.
alert_events = Table(
    "alert_events",
    metadata,
    Column("id", SeriesId, primary_key=True, autoincrement=True),
    Column("ts", BigInteger, nullable=False),
    Column("fingerprint", Text, nullable=False),
    Column("labels", Text, nullable=False),
    Column("annotations", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("starts_at", BigInteger, nullable=False),
    Column("ends_at", BigInteger, nullable=True),
    Column("source", Text, nullable=False),
    Column("group_key", Text, nullable=True),
    Index(None, "ts"),
    Index(None, "fingerprint", "ts"),
    Index(None, "starts_at"),
)

# --- weekly reports (alerts/report through store/reports.py) ---------------------------------

# One row per (ISO week, configuration): the unique key is what makes a report produced once
# however many ``serve`` processes race for it (an INSERT that loses the race does nothing).
# ``config_key`` hashes what shapes the report (time zone, SLOs, targets and intervals, the
# report's thresholds).  The three renderings are kept whole: the API serves them as they
# were sent.  Added in schema version 3 without a version bump: a new table, created by
# ``create_all`` on an existing database too (store/migrate.py has nothing to move).
reports = Table(
    "reports",
    metadata,
    Column("id", SeriesId, primary_key=True, autoincrement=True),
    Column("week", Text, nullable=False),
    Column("config_key", Text, nullable=False),
    Column("timezone", Text, nullable=False),
    Column("start_ms", BigInteger, nullable=False),
    Column("end_ms", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("summary", Text, nullable=False),  # JSON: the report's ``summary``
    Column("json", Text, nullable=False),
    Column("html", Text, nullable=False),
    Column("markdown", Text, nullable=False),
    UniqueConstraint("week", "config_key"),
    Index(None, "start_ms"),
)

# The outcome of each delivery of a kept report, per channel (``webhook``, ``smtp``):
# ``serve``'s report job retries an undelivered one on its next runs until ``attempts``
# reaches ``reports.delivery_attempts``.  A new table (like ``reports``), so ``create_all``
# adds it to an existing database without a version bump; an older tritonwatch ignores it.
report_deliveries = Table(
    "report_deliveries",
    metadata,
    Column("report_id", SeriesId, nullable=False),
    Column("channel", Text, nullable=False),
    Column("delivered", Boolean, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("last_attempt_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("report_id", "channel"),
)
