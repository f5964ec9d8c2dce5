"""The user-facing configuration file (``tritonwatch.yaml``), validated once at start-up.

Every model is frozen: the running process cannot mutate its configuration, and the same value
can be handed to every job.  ``load_config`` turns pydantic's errors into ``ConfigError``, whose
lines each name the key path (``targets[2].metrics_url: ...``), in the spirit of DataDog's
"Entry #3 of setting `targets`" messages.

The value types (durations, sizes, URLs, headers, secrets) live in schemas/values.py; each
section with a module of its own (``nvml``, ``probes``, ``alerting``, ``reports``, ``cluster``,
``remote_write``) builds on those alone, and this module assembles them into ``Config``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tritonwatch.schemas import configfile
from tritonwatch.schemas.alerting import AlertingConfig
from tritonwatch.schemas.cluster import ClusterConfig
from tritonwatch.schemas.nvml import NvmlConfig
from tritonwatch.schemas.probes import ProbeConfig
from tritonwatch.schemas.remote_write import RemoteWriteConfig, TimeseriesConfig
from tritonwatch.schemas.reports import ReportsConfig

# Re-exported: the store's spill directory and the remote-write buffers default under it.
from tritonwatch.schemas.values import DEFAULT_DATA_DIR as DEFAULT_DATA_DIR
from tritonwatch.schemas.values import (
    ByteSize,
    Frozen,
    GrpcAddress,
    Headers,
    HttpUrl,
    PositiveDuration,
    first_repeat,
    host_port,
    real_secret,
    supported_version,
)

DEFAULT_STORE_URL = f"sqlite:///{DEFAULT_DATA_DIR}/tritonwatch.db"


#: Most models one target may list in ``expected_models``, and the longest name.
EXPECTED_MODELS_MAX = 1000
MODEL_NAME_MAX = 500


class TargetConfig(Frozen):
    """One Triton server to watch."""

    # Header values are secrets: keep them out of ValidationError's text (when validated on
    # its own; inside ``Config`` the outer model's setting applies).
    model_config = ConfigDict(hide_input_in_errors=True)

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+$")
    """Unique name; stored as the ``target`` of every series from this server."""
    metrics_url: HttpUrl
    """The Prometheus endpoint, usually ``http://host:8002/metrics``."""
    http_url: HttpUrl | None = None
    """Triton's HTTP API (``http://host:8000``): statistics and model configs."""
    grpc_url: GrpcAddress | None = None
    """Triton's gRPC API (``host:8001``); used for statistics when ``http_url`` is unset."""
    headers: Headers = Field(default_factory=dict)
    """Extra HTTP headers on every request (e.g. ``Authorization``); values are never logged.
    Values must not contain CR, LF or other control characters."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels attached to this target (cluster, region, ...)."""
    scrape_interval: PositiveDuration | None = None
    """Overrides ``scrape.interval`` for this target."""
    scrape_timeout: PositiveDuration | None = None
    """Overrides ``scrape.timeout`` for this target; must not exceed the target's interval."""
    max_batch_size: dict[str, int] = Field(default_factory=dict)
    """Fill-rate denominators per model, for servers whose model-config API is unreachable."""
    sample_limit: int | None = Field(default=None, ge=0)
    """Overrides ``scrape.sample_limit`` for this target (0: no limit)."""
    label_limit: int | None = Field(default=None, ge=0)
    """Overrides ``scrape.label_limit`` for this target (0: no limit)."""
    label_name_length_limit: int | None = Field(default=None, ge=0)
    """Overrides ``scrape.label_name_length_limit`` for this target (0: no limit)."""
    label_value_length_limit: int | None = Field(default=None, ge=0)
    """Overrides ``scrape.label_value_length_limit`` for this target (0: no limit)."""
    series_limit: int | None = Field(default=None, ge=0)
    """Overrides ``scrape.series_limit`` for this target (0: no limit)."""
    expected_models: tuple[str, ...] = Field(default=(), max_length=EXPECTED_MODELS_MAX)
    """Models that should be loaded on this target: each one the repository index does not
    list as loaded reads ``triton_model_ready`` 0 ("not loaded") and fires ModelNotReady.
    Needs ``http_url`` or ``grpc_url`` (readiness is read through Triton's API)."""

    @field_validator("expected_models")
    @classmethod
    def _model_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        seen: set[str] = set()
        for i, name in enumerate(value):
            if not name or len(name) > MODEL_NAME_MAX or not name.isprintable():
                raise ValueError(f"expected_models[{i}] must be 1..{MODEL_NAME_MAX} printable "
                                 "characters")
            if name in seen:
                raise ValueError(f"expected_models[{i}]: {name!r} is listed twice")
            seen.add(name)
        return value

    @model_validator(mode="after")
    def _expected_needs_api(self) -> TargetConfig:
        if self.expected_models and not (self.http_url or self.grpc_url):
            raise ValueError(f"target {self.name!r}: expected_models needs http_url or "
                             "grpc_url (readiness is read through Triton's API)")
        return self

    @field_validator("max_batch_size")
    @classmethod
    def _non_negative(cls, value: dict[str, int]) -> dict[str, int]:
        for model, size in value.items():
            if size < 0:
                raise ValueError(f"max_batch_size of {model!r} must be >= 0")
        return value


class ScrapeLimits(NamedTuple):
    """One target's limits, resolved (``Config.limits_for``); 0 means no limit."""

    sample_limit: int
    label_limit: int
    label_name_length_limit: int
    label_value_length_limit: int
    series_limit: int


class ScrapeConfig(Frozen):
    interval: PositiveDuration = 15.0
    """How often every target's /metrics is scraped."""
    timeout: PositiveDuration = 10.0
    """Per-scrape deadline (connect + read of the whole body)."""
    max_body_bytes: ByteSize = 50 * 1024 * 1024
    """A body larger than this (after gzip) fails the scrape instead of filling memory."""
    api_interval: PositiveDuration = 60.0
    """How often the statistics and model-config APIs are read."""
    max_concurrency: int = Field(default=64, ge=1)
    """Scrapes in flight at once across all targets."""
    # The limits below bound what one target can make the collector parse, keep and store.
    # The defaults are an order of magnitude above a big TensorRT-LLM server (a few thousand
    # series) and far below what takes the process's memory (1.38 M series did).
    sample_limit: int = Field(default=50_000, ge=0)
    """Most samples one scrape may hold.  A scrape over it fails as a whole, as Prometheus's
    ``sample_limit`` does: ``up`` is 0, the target's health says ``sample limit exceeded
    (N > limit)`` and nothing of that scrape is stored.  0: no limit."""
    label_limit: int = Field(default=64, ge=0)
    """Most labels on one sample (as the target exposes it; the configured target labels not
    counted).  Over it, the scrape fails as a whole.  0: no limit."""
    label_name_length_limit: int = Field(default=256, ge=0)
    """Longest label name, in characters.  Over it, the scrape fails as a whole.  0: no
    limit."""
    label_value_length_limit: int = Field(default=4096, ge=0)
    """Longest label value, in characters.  Over it, the scrape fails as a whole.  0: no
    limit."""
    series_limit: int = Field(default=100_000, ge=0)
    """Most distinct series one target may have in the store (raw, derived, statistics API and
    probe series, over time: series leave when retention empties them).  New series beyond it
    are refused, counted (``tritonwatch_series_limit_refused_samples_total``) and warned about;
    the target's existing series keep flowing.  0: no limit."""

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> ScrapeConfig:
        if self.timeout > self.interval:
            raise ValueError(
                f"timeout ({self.timeout:g}s) must not exceed interval ({self.interval:g}s)"
            )
        return self


#: How often the store's writer resolves again every series it writes, which marks them in use
#: for retention (``store.flush``; not imported: schemas must not depend on the store): half
#: the raw retention, between these bounds.  Raw retention must exceed the shortest.
SERIES_CACHE_TTL_MIN_S = 600.0
SERIES_CACHE_TTL_MAX_S = 3600.0


class RetentionConfig(Frozen):
    raw: PositiveDuration = 15 * 86400.0
    """How long raw samples are kept; must exceed 10 minutes."""
    rollup_5m: PositiveDuration = 90 * 86400.0
    rollup_1h: PositiveDuration = 400 * 86400.0

    @field_validator("raw")
    @classmethod
    def _longer_than_series_cache(cls, value: float) -> float:
        if value <= SERIES_CACHE_TTL_MIN_S:
            raise ValueError(
                f"must exceed 10 minutes ({SERIES_CACHE_TTL_MIN_S:g}s), got {value:g}s: the "
                "store re-resolves its series at least that often and relies on raw samples "
                "outliving that"
            )
        return value

    @property
    def series_cache_ttl(self) -> float:
        """Seconds the store's writer keeps a target's series ids before resolving them again.

        Resolving marks a series in use: retention deletes a series holding no data only when
        no writer has resolved it for longer than the raw retention, so a writer must resolve
        the ids it holds again within that time, or it could write to a deleted series.  The
        ids are kept for half the raw retention, at least 10 minutes (raw retention is longer)
        and at most an hour.

        Each time, every series of the fleet is upserted again: 566,000 rows at 1,000
        targets, a quarter of the flush's CPU while it ran every 10 minutes.
        """
        return min(SERIES_CACHE_TTL_MAX_S, max(SERIES_CACHE_TTL_MIN_S, self.raw / 2))


class StoreConfig(Frozen):
    url: str = DEFAULT_STORE_URL
    """``sqlite:///path.db`` (embedded default) or ``postgresql://user:pass@host/db``."""
    flush_interval: PositiveDuration = 15.0
    """Buffered samples are committed at least this often.  Each commit appends a row per
    target and metric name to the sample log (``store.samplelog``) and costs a transaction, so
    fewer, larger commits are cheaper.  Alert evaluation flushes first, so rules never see
    stale data; other readers (the API, the CLI) see a scrape at most this long after it, and a
    crash loses at most this much."""
    batch_samples: int = Field(default=1_000_000, ge=1_000, le=10_000_000)
    """Commit early once this many samples are buffered.  Each commit rewrites a page per name
    it touches, so fewer, larger commits are cheaper; the buffer holds up to 10x this while the
    database is unavailable."""
    retention: RetentionConfig = RetentionConfig()
    statement_timeout: PositiveDuration = 60.0
    """PostgreSQL: the server cancels a statement after this long; a server that does not
    answer for this plus 10 s (a frozen host) has its connection dropped by the client."""
    spill_dir: str | None = None
    """Where ``serve`` writes what the store would not take at shutdown, to store it at the
    next start; default ``spill/`` beside the SQLite file, or ``tritonwatch-data/spill``."""
    writer_lock: bool = True
    """PostgreSQL: refuse to start while another ``serve`` writes to the same database (an
    advisory lock).  SQLite always takes its lock file."""
    timeseries: TimeseriesConfig | None = None
    """Time series on a Prometheus-compatible TSDB (``schemas/remote_write.py``); ``url``
    must then be PostgreSQL, which keeps the relational state (README "Time series on a
    TSDB")."""

    @model_validator(mode="after")
    def _timeseries_beside_postgres(self) -> StoreConfig:
        if self.timeseries is not None and self.url.split(":", 1)[0] == "sqlite":
            raise ValueError("timeseries: needs url to be PostgreSQL (postgresql://...), which "
                             "keeps the relational state beside the TSDB")
        return self

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = value.split(":", 1)[0]
        if scheme not in ("sqlite", "postgresql", "postgresql+psycopg", "postgres"):
            raise ValueError("must start with sqlite:/// or postgresql://")
        # The checks of store.engine.parse_url, replicated (schemas must not import store).
        # Messages never quote the URL: it may hold a password.
        try:
            parsed = make_url(value)
        except (ArgumentError, ValueError):  # ValueError: e.g. a port that is not a number
            raise ValueError(
                "is not a database URL (use sqlite:///path.db or postgresql://user@host/db)"
            ) from None
        if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
            raise ValueError(
                "names no database file (an in-memory database is not shared between "
                "connections); use sqlite:///path/to/file.db"
            )
        return value


class ApiConfig(Frozen):
    listen: str = "127.0.0.1:8080"
    """host:port of the HTTP API (health, /metrics, queries)."""
    token: str | None = None
    """Bearer token required by write endpoints (which refuse every request without one).
    The environment variable TRITONWATCH_API_TOKEN, when set and non-empty, overrides this
    value."""
    auth_reads: bool = False
    """Require the token on reads too: the query API, /metrics, /docs and /openapi.json
    (/healthz always stays open for probes)."""
    default_limit: int = Field(default=1_000, ge=1)
    """Items of a list answer (series, targets) when the request gives no ``limit``."""
    max_limit: int = Field(default=10_000, ge=1)
    """The largest ``limit`` a list request may ask for."""
    max_series: int = Field(default=10_000, ge=1)
    """Series one range query may select (422 beyond, before any sample is read)."""
    max_samples: int = Field(default=2_000_000, ge=1)
    """Samples (or rollup rows) one range query may read (422 beyond, counted before).  An
    answer of 2 M points took about 110 MB in the API while it was built."""
    read_workers: int = Field(default=4, ge=1, le=64)
    """Threads that run database reads for the API (separate from everything else)."""
    read_queue: int = Field(default=16, ge=0)
    """Reads that may wait for one of those threads; beyond, a read gets 503 at once."""
    max_exported_series: int = Field(default=100_000, ge=1)
    """Series /metrics exports from memory (SLIs, SLO status, alerts) per scrape; the rest are
    counted in ``tritonwatch_exported_series_dropped_total``."""
    read_token_required: bool | None = None
    """Alias of ``auth_reads`` (the name issue 17 uses); when set, it wins."""

    @field_validator("token")
    @classmethod
    def _no_placeholder(cls, value: str | None) -> str | None:
        return None if value is None else real_secret(value)

    @model_validator(mode="after")
    def _reads_need_a_token(self) -> ApiConfig:
        if self.read_token_required is not None:
            # Frozen model: the alias is folded into the one setting the API reads.
            object.__setattr__(self, "auth_reads", self.read_token_required)
        if self.auth_reads and self.token is None:
            raise ValueError("auth_reads needs api.token (or TRITONWATCH_API_TOKEN) to be set")
        if self.default_limit > self.max_limit:
            raise ValueError(f"default_limit ({self.default_limit}) must not exceed max_limit "
                             f"({self.max_limit})")
        return self

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host_port(value)
        return value


class Config(Frozen):
    # ValidationError's text would quote inputs, header values (secrets) included; the lines of
    # ConfigError never do.  Only the outermost model's setting counts.
    model_config = ConfigDict(hide_input_in_errors=True)

    version: int = 1
    """Version of this file's format."""
    targets: tuple[TargetConfig, ...] = ()
    scrape: ScrapeConfig = ScrapeConfig()
    store: StoreConfig = StoreConfig()
    api: ApiConfig = ApiConfig()
    nvml: NvmlConfig = Field(default_factory=NvmlConfig)
    """Local GPU telemetry through NVML (a host without NVML gets one health entry, no crash)."""
    probes: tuple[ProbeConfig, ...] = ()
    """Synthetic LLM probes (see schemas/probes.py and the README's Probes section)."""
    alerting: AlertingConfig = Field(default_factory=AlertingConfig)
    """Alert evaluation and delivery (see schemas/alerting.py)."""
    reports: ReportsConfig = Field(default_factory=ReportsConfig)
    """The weekly SLO report (see schemas/reports.py)."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Several serve processes on one PostgreSQL (see schemas/cluster.py)."""
    remote_write: tuple[RemoteWriteConfig, ...] = ()
    """Prometheus remote-write receivers every stored sample also goes to (see
    schemas/remote_write.py); names unique."""

    @field_validator("version")
    @classmethod
    def _supported_version(cls, value: int) -> int:
        return supported_version(value, "config")

    @model_validator(mode="after")
    def _unique_targets(self) -> Config:
        repeat = first_repeat([target.name for target in self.targets])
        if repeat is not None:
            raise ValueError(f"target name {repeat[1]!r} is used twice")
        return self

    @model_validator(mode="after")
    def _store_receiver_name(self) -> Config:
        if self.store.timeseries is not None and any(
                r.name == "store" for r in self.remote_write):
            raise ValueError("remote_write: the name 'store' is taken by store.timeseries "
                             "(its samples travel as a receiver of that name)")
        return self

    @model_validator(mode="after")
    def _cluster_needs_postgres(self) -> Config:
        if self.cluster.enabled and self.store.url.startswith("sqlite"):
            raise ValueError("cluster.enabled: members share one PostgreSQL; store.url is a "
                             "SQLite file (one process only)")
        return self

    @model_validator(mode="after")
    def _unique_remote_writes(self) -> Config:
        repeat = first_repeat([remote.name for remote in self.remote_write])
        if repeat is not None:
            raise ValueError(f"remote_write[{repeat[0]}]: name {repeat[1]!r} is used twice")
        return self

    @model_validator(mode="after")
    def _target_timeouts_within_interval(self) -> Config:
        for i, target in enumerate(self.targets):
            timeout, interval = target.scrape_timeout, self.interval_for(target)
            if timeout is not None and timeout > interval:
                raise ValueError(
                    f"targets[{i}].scrape_timeout: {timeout:g}s must not exceed the target's "
                    f"scrape interval ({interval:g}s)"
                )
        return self

    @model_validator(mode="after")
    def _probes_resolve(self) -> Config:
        targets = {t.name: t for t in self.targets}
        names: set[str] = set()
        for i, probe in enumerate(self.probes):
            where = f"probes[{i}]"
            if probe.name in names:
                raise ValueError(f"{where}: probe name {probe.name!r} is used twice")
            names.add(probe.name)
            if probe.url is not None:
                continue
            target = targets.get(probe.target or "")
            if target is None:
                raise ValueError(f"{where}: target {probe.target!r} is not in `targets`")
            if probe.protocol == "grpc" and target.grpc_url is None:
                raise ValueError(f"{where}: target {target.name!r} has no grpc_url; set `url`")
            if probe.protocol == "http" and target.http_url is None:
                raise ValueError(f"{where}: target {target.name!r} has no http_url; set `url`")
            if probe.protocol == "openai":
                raise ValueError(f"{where}: protocol openai needs its own `url`")
        return self

    def interval_for(self, target: TargetConfig) -> float:
        return target.scrape_interval or self.scrape.interval

    def limits_for(self, target: TargetConfig) -> ScrapeLimits:
        """The target's own limits where it sets them, else those of ``scrape``."""
        def pick(own: int | None, default: int) -> int:
            return default if own is None else own

        s = self.scrape
        return ScrapeLimits(
            sample_limit=pick(target.sample_limit, s.sample_limit),
            label_limit=pick(target.label_limit, s.label_limit),
            label_name_length_limit=pick(target.label_name_length_limit,
                                         s.label_name_length_limit),
            label_value_length_limit=pick(target.label_value_length_limit,
                                          s.label_value_length_limit),
            series_limit=pick(target.series_limit, s.series_limit),
        )

    def timeout_for(self, target: TargetConfig) -> float:
        """The target's own ``scrape_timeout`` (validated: at most its interval), else
        ``scrape.timeout`` capped at the target's interval (a shorter per-target interval)."""
        if target.scrape_timeout is not None:
            return target.scrape_timeout
        return min(self.scrape.timeout, self.interval_for(target))


class ConfigError(ValueError):
    """Invalid configuration; ``errors`` holds one ``key.path: message`` line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: " + "; ".join(errors))


API_TOKEN_ENV = "TRITONWATCH_API_TOKEN"


def validate_config(
    data: Any, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> Config:
    """Validate parsed YAML.

    First ``${VAR}`` references in string values are expanded from ``environ`` (default
    ``os.environ``; see schemas/configfile.py), and the expanded size of the whole document
    and of each free-form value is bounded.  ``TRITONWATCH_API_TOKEN``, when set and
    non-empty, sets ``api.token`` and wins over the file's value (deployments inject the
    secret that way).  Error lines never quote a secret (see :func:`configfile.redact_text`).
    """
    environ = os.environ if environ is None else environ
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, [f"(top level): expected a mapping, got {type(data).__name__}"])
    # Bounded (and free of cycles) before anything else walks it; again once expanded.
    size_errors = configfile.size_errors(data)
    if size_errors:
        raise ConfigError(source, size_errors)
    data, env_errors, env_used = configfile.expand_env(data, environ)
    size_errors = configfile.size_errors(data)
    if env_errors or size_errors:
        raise ConfigError(source, size_errors + env_errors)
    secrets = configfile.secret_strings(data) | {v for v in env_used.values() if len(v) >= 4}
    token = environ.get(API_TOKEN_ENV)
    if token:
        secrets.add(token)
        api = data.get("api")
        # Anything but a mapping is left for validation to report.
        if api is None or isinstance(api, Mapping):
            data["api"] = {**(api or {}), "token": token}
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = [
            configfile.redact_text(_KEYED_TOP_LEVEL_RE.sub("", line), secrets)
            for line in error_lines(exc)
        ]
        if token:
            lines = [
                f"{line} (from {API_TOKEN_ENV})" if line.startswith("api.token:") else line
                for line in lines
            ]
        raise ConfigError(source, lines) from None


def error_lines(exc: ValidationError) -> list[str]:
    """One ``key.path: message`` line per error of ``exc`` (shared with the rules file)."""
    lines = []
    for err in exc.errors(include_url=False):
        # The "after" validators of a model report at the model's own path; pydantic
        # prefixes their message with "Value error, ", which adds nothing for a reader.
        message = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{configfile.key_path(err['loc'])}: {message}")
    return lines


# A top-level check of ``Config`` that names the key itself: ``targets[0].scrape_timeout: ...``.
_KEYED_TOP_LEVEL_RE = re.compile(r"^\(top level\): (?=[A-Za-z_]\w*(\[\d+\])?(\.\w+(\[\d+\])?)*: )")


def load_config(path: str | Path | None) -> Config:
    """Read and validate a YAML file; ``None`` gives the embedded defaults."""
    if path is None:
        return validate_config({}, "<defaults>")
    return validate_config(read_yaml(path), str(path))


def read_yaml(path: str | Path) -> Any:
    """The parsed YAML of ``path``; unreadable, oversized, non-UTF-8 files, bad YAML and
    documents whose aliases expand past ``configfile.MAX_EXPANDED_BYTES`` raise
    ``ConfigError``.  No message quotes the file's text: it may hold a secret."""
    source = str(path)
    try:
        with open(path, "rb") as file:
            raw = file.read(configfile.MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, [f"cannot read file: {exc.strerror or exc}"]) from None
    if len(raw) > configfile.MAX_FILE_BYTES:
        raise ConfigError(source, [
            f"file is larger than {configfile.MAX_FILE_BYTES >> 20} MiB; a configuration "
            "file is never that big (is this the right file?)"
        ])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(source, [
            f"line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02X} at offset {exc.start}); "
            "save the file as UTF-8"
        ]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [_yaml_error(exc)]) from None
    except RecursionError:  # PyYAML parses nested collections recursively
        raise ConfigError(source, [
            f"invalid YAML: collections nested too deeply (at most {configfile.MAX_DEPTH} "
            "levels are allowed)"
        ]) from None
    # A billion-laughs guard for every YAML file read (free-form bounds are the config's).
    errors = configfile.size_errors(data, free_form=())
    if errors:
        raise ConfigError(source, errors)
    return data


def _yaml_error(exc: yaml.YAMLError) -> str:
    """``line L, column C: invalid YAML: <problem>``: PyYAML's own text would quote the
    offending line, which may hold a token."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if isinstance(exc, yaml.MarkedYAMLError) and problem:
        what = f"{problem} ({context})" if context else str(problem)
    else:
        what = type(exc).__name__
    return f"{where}invalid YAML: {what}"
