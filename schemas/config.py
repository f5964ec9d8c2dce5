"""The user-facing configuration file (``tritonwatch.yaml``), validated once at start-up.

Every model is frozen: the running process cannot mutate its configuration, and the same value
can be handed to every job.  ``load_config`` turns pydantic's errors into ``ConfigError``, whose
lines each name the key path (``targets[2].metrics_url: ...``), in the spirit of DataDog's
"Entry #3 of setting `targets`" messages.

Durations are Prometheus-style strings (``15s``, ``5m``, ``1h30m``, ``28d``) or plain seconds;
sizes accept ``KiB``/``MiB``/``GiB`` suffixes or plain bytes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from schemas.nvml import NvmlConfig
from schemas.probes import ProbeConfig

DEFAULT_DATA_DIR = Path("tritonwatch-data")
DEFAULT_STORE_URL = f"sqlite:///{DEFAULT_DATA_DIR}/tritonwatch.db"

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$")
_SIZE_UNITS = {
    None: 1, "B": 1, "KB": 1000, "KiB": 1024, "MB": 1000**2, "MiB": 1024**2,
    "GB": 1000**3, "GiB": 1024**3,
}
# Placeholders people paste from examples; refusing them at start-up beats shipping a
# guessable token into production.
_PLACEHOLDER_SECRETS = frozenset({"changeme", "change-me", "secret", "token", "xxx", "password"})


def parse_duration(value: Any) -> float:
    """Seconds from ``15s``/``1h30m``/``2.5`` (seconds); raises ValueError quoting the input."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION_RE.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(
                    f"invalid duration {value!r}: use e.g. 500ms, 15s, 5m, 1h30m, 28d"
                ) from None
    else:
        raise ValueError(f"invalid duration {value!r}")
    if seconds < 0:
        raise ValueError(f"duration {value!r} must not be negative")
    return seconds


def parse_size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ValueError(f"invalid size {value!r}: use e.g. 1048576, 512KiB, 50MiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def _positive(value: float) -> float:
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


# In the exported JSON Schema a duration is what a user may write: seconds or "1h30m".
_DURATION_SCHEMA = WithJsonSchema({
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": r"^\s*((\d+(\.\d+)?)(ms|s|m|h|d|w))+\s*$"},
    ],
    "description": "seconds, or a Prometheus-style duration: 500ms, 15s, 5m, 1h30m, 28d",
})
Duration = Annotated[float, BeforeValidator(parse_duration), _DURATION_SCHEMA]
PositiveDuration = Annotated[
    float, BeforeValidator(parse_duration), AfterValidator(_positive), _DURATION_SCHEMA
]
ByteSize = Annotated[int, BeforeValidator(parse_size), AfterValidator(_positive)]


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


def _grpc_address(value: str) -> str:
    # tritonclient.grpc wants host:port without a scheme.
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{value!r} is not host:port")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]
GrpcAddress = Annotated[str, AfterValidator(_grpc_address)]


class _Frozen(BaseModel):
    # Field docstrings become descriptions in the exported JSON Schema.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class TargetConfig(_Frozen):
    """One Triton server to watch."""

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+$")
    """Unique name; stored as the ``target`` of every series from this server."""
    metrics_url: HttpUrl
    """The Prometheus endpoint, usually ``http://host:8002/metrics``."""
    http_url: HttpUrl | None = None
    """Triton's HTTP API (``http://host:8000``): statistics and model configs."""
    grpc_url: GrpcAddress | None = None
    """Triton's gRPC API (``host:8001``); used for statistics when ``http_url`` is unset."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra HTTP headers on every request (e.g. ``Authorization``); values are never logged."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels attached to this target (cluster, region, ...)."""
    scrape_interval: PositiveDuration | None = None
    """Overrides ``scrape.interval`` for this target."""
    scrape_timeout: PositiveDuration | None = None
    """Overrides ``scrape.timeout`` for this target."""
    max_batch_size: dict[str, int] = Field(default_factory=dict)
    """Fill-rate denominators per model, for servers whose model-config API is unreachable."""

    @field_validator("max_batch_size")
    @classmethod
    def _non_negative(cls, value: dict[str, int]) -> dict[str, int]:
        for model, size in value.items():
            if size < 0:
                raise ValueError(f"max_batch_size of {model!r} must be >= 0")
        return value


class ScrapeConfig(_Frozen):
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

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> ScrapeConfig:
        if self.timeout > self.interval:
            raise ValueError(
                f"timeout ({self.timeout:g}s) must not exceed interval ({self.interval:g}s)"
            )
        return self


class RetentionConfig(_Frozen):
    raw: PositiveDuration = 15 * 86400.0
    """How long raw samples are kept."""
    rollup_5m: PositiveDuration = 90 * 86400.0
    rollup_1h: PositiveDuration = 400 * 86400.0


class StoreConfig(_Frozen):
    url: str = DEFAULT_STORE_URL
    """``sqlite:///path.db`` (embedded default) or ``postgresql://user:pass@host/db``."""
    flush_interval: PositiveDuration = 5.0
    """Buffered samples are committed at least this often."""
    retention: RetentionConfig = RetentionConfig()

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = value.split(":", 1)[0]
        if scheme not in ("sqlite", "postgresql", "postgresql+psycopg", "postgres"):
            raise ValueError("must start with sqlite:/// or postgresql://")
        return value


class ApiConfig(_Frozen):
    listen: str = "127.0.0.1:8080"
    """host:port of the HTTP API (health, /metrics, queries)."""
    token: str | None = None
    """Bearer token required by write endpoints; also read from TRITONWATCH_API_TOKEN."""

    @field_validator("token")
    @classmethod
    def _no_placeholder(cls, value: str | None) -> str | None:
        if value is not None and (value.lower() in _PLACEHOLDER_SECRETS or len(value) < 16):
            raise ValueError("is a placeholder or shorter than 16 characters; set a real secret")
        return value

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        _grpc_address(value)
        return value


class Config(_Frozen):
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
    alerting: _alerting.AlertingConfig = Field(default_factory=lambda: _alerting.AlertingConfig())
    """Alert evaluation and delivery (see schemas/alerting.py)."""

    @field_validator("version")
    @classmethod
    def _supported_version(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"unsupported config version {value}; this release reads version 1")
        return value

    @model_validator(mode="after")
    def _unique_targets(self) -> Config:
        seen: set[str] = set()
        for target in self.targets:
            if target.name in seen:
                raise ValueError(f"target name {target.name!r} is used twice")
            seen.add(target.name)
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

    def timeout_for(self, target: TargetConfig) -> float:
        return min(target.scrape_timeout or self.scrape.timeout, self.interval_for(target))


class ConfigError(ValueError):
    """Invalid configuration; ``errors`` holds one ``key.path: message`` line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: " + "; ".join(errors))


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def validate_config(data: Any, source: str = "<config>") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, [f"(top level): expected a mapping, got {type(data).__name__}"])
    data = dict(data)
    token = os.environ.get("TRITONWATCH_API_TOKEN")
    if token:
        api = dict(data.get("api") or {})
        api.setdefault("token", token)
        data["api"] = api
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, error_lines(exc)) from None


def error_lines(exc: ValidationError) -> list[str]:
    """One ``key.path: message`` line per error of ``exc`` (shared with the rules file)."""
    lines = []
    for err in exc.errors(include_url=False):
        # The "after" validators of a model report at the model's own path; pydantic
        # prefixes their message with "Value error, ", which adds nothing for a reader.
        message = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{_key_path(tuple(err['loc']))}: {message}")
    return lines


def load_config(path: str | Path | None) -> Config:
    """Read and validate a YAML file; ``None`` gives the embedded defaults."""
    if path is None:
        return validate_config({}, "<defaults>")
    return validate_config(read_yaml(path), str(path))


def read_yaml(path: str | Path) -> Any:
    """The parsed YAML of ``path``; unreadable files and bad YAML raise ``ConfigError``."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, [f"cannot read file: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(source, [f"{where}invalid YAML: {exc}"]) from None
    return data


# schemas.alerting builds on this module's types, so it is imported last, as a module: that
# works in either import order (``Config`` resolves ``_alerting.AlertingConfig`` on first use).
from schemas import alerting as _alerting  # noqa: E402

if hasattr(_alerting, "AlertingConfig"):
    Config.model_rebuild()
