"""``tritonwatch inspect``: parse a /metrics URL or saved file and show what Tritonwatch sees.

One snapshot lists families, series counts and the SLIs a single reading gives (gauges:
KV-cache, GPU, pending requests).  Two snapshots (two files, or one URL read twice
``--seconds`` apart) add the per-model rates and ratios (request rate, batch fill rate, queue
time, ...).  Fill rate needs ``max_batch_size``: it is read from the live server's model-config
API (``--http-url``, or for a URL source the URL's own origin, as behind a proxy that serves
both, then the same host's port 8000), or given as ``--max-batch-size MODEL=N``.  When it cannot
be read, ``config_error`` says which URLs were tried and why each failed, and the table keeps
its fill column with ``?`` instead of dropping it.

The result's ``models`` is keyed by model name.  A model served in one version maps to the flat
dict of its SLIs (``{"request_rate": 3.2, ...}``).  A model served in several versions at once
(a canary rollout) maps to ``{"versions": {"1": {SLIs}, "2": {SLIs}}}`` instead: one version's
numbers are never passed off as the model's.  ``model_versions`` lists every model's versions
(``{"resnet": ["1"]}``), for the single-version case too.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tritonwatch.collector.derive import Deriver
from tritonwatch.collector.parse import parse
from tritonwatch.collector.scrape import fetch_metrics, make_client, redact_url
from tritonwatch.collector.triton import TritonApi, TritonApiError
from tritonwatch.schemas.samples import MetricFamily, Sample, Snapshot, label_value
from tritonwatch.schemas.triton import ModelConfigInfo

TARGET = "inspect"


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


async def read_source(source: str, timeout: float = 10.0, max_bytes: int = 256 << 20) -> str:
    if is_url(source):
        async with make_client() as client:
            body = await fetch_metrics(client, source, source, timeout=timeout,
                                       max_bytes=max_bytes)
        return body.text
    return Path(source).read_text(encoding="utf-8")


#: Triton's default HTTP port; the metrics port (8002 by default) is often changed or proxied.
TRITON_HTTP_PORT = 8000


def guess_http_urls(metrics_url: str) -> list[str]:
    """Where Triton's HTTP API may be, given its /metrics URL: the URL's own origin (a proxy
    serving both; and surely the same server if it answers), then the same host on port 8000
    (Triton's default).  Never assumes the metrics port is 8002."""
    parts = urlsplit(metrics_url)
    if not parts.hostname:
        return []
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    candidates = [urlunsplit((parts.scheme, f"{host}:{port}", "", "", ""))]
    if port != TRITON_HTTP_PORT:
        candidates.append(urlunsplit((parts.scheme, f"{host}:{TRITON_HTTP_PORT}", "", "", "")))
    return candidates


def model_configs(
    http_urls: Sequence[str], overrides: Mapping[str, int], timeout: float = 5.0
) -> tuple[dict[str, ModelConfigInfo], str | None]:
    """Model configs from the first of ``http_urls`` that answers, then ``overrides``; and,
    when none answered, one line saying which URLs were tried and why each failed."""
    configs: dict[str, ModelConfigInfo] = {}
    failures = []
    for url in http_urls:
        try:
            api = TritonApi(TARGET, http_url=url, grpc_url=None, timeout=timeout)
            configs = api.read_blocking(time.time()).configs
        except TritonApiError as exc:
            failures.append(f"{redact_url(url)}: {exc.reason}")
            continue
        failures = []
        break
    error = None
    if failures:
        missing = "" if overrides else " (the fill column needs it)"
        error = (f"max_batch_size could not be read from Triton's HTTP API{missing}: tried "
                 + "; ".join(failures)
                 + ". Pass --http-url http://HOST:PORT or --max-batch-size MODEL=N")
    for model, size in overrides.items():
        configs[model] = ModelConfigInfo(name=model, max_batch_size=size)
    return configs, error


def _clean(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


def _version_order(version: str) -> tuple[bool, int, str]:
    # Numeric versions numerically (Triton's are integers), anything else after, by name.
    return (not version.isdigit(), int(version) if version.isdigit() else 0, version)


def summarise(
    families: Sequence[MetricFamily], derived: Sequence[Sample], interval: float | None,
    config_error: str | None = None,
) -> dict[str, Any]:
    """The ``--json`` result; see the module docstring for the shape of ``models``."""
    per_version: dict[str, dict[str, dict[str, float | None]]] = {}
    gpus: dict[str, dict[str, float | None]] = {}
    server: dict[str, float | None] = {}
    for sample in derived:
        name = sample.name.removeprefix("sli:")
        model = label_value(sample.labels, "model")
        gpu = label_value(sample.labels, "gpu_uuid")
        reason = label_value(sample.labels, "reason")
        key = f"{name}{{reason={reason}}}" if reason else name
        if model:
            version = label_value(sample.labels, "version")
            per_version.setdefault(model, {}).setdefault(version, {})[key] = _clean(sample.value)
        elif gpu:
            gpus.setdefault(gpu, {})[key] = _clean(sample.value)
        else:
            server[key] = _clean(sample.value)
    models: dict[str, dict[str, Any]] = {}
    model_versions: dict[str, list[str]] = {}
    for model, versions in sorted(per_version.items()):
        order = sorted(versions, key=_version_order)
        model_versions[model] = order
        if len(order) == 1:
            models[model] = versions[order[0]]
        else:
            models[model] = {"versions": {v: versions[v] for v in order}}
    out: dict[str, Any] = {
        "families": [
            {"name": f.name, "type": f.type, "series": len(f.samples)} for f in families
        ],
        "series": sum(len(f.samples) for f in families),
        "interval_s": interval,
        "models": models,
        "model_versions": model_versions,
        "gpus": dict(sorted(gpus.items())),
        "server": server,
    }
    if config_error:
        out["config_error"] = config_error
    return out


async def inspect_sources(
    source: str, source2: str | None, *, seconds: float | None,
    max_batch_size: Mapping[str, int], http_url: str | None,
) -> dict[str, Any]:
    if source2 is None and seconds is not None and not is_url(source):
        raise ValueError("--seconds without SOURCE2 needs a URL to read twice")
    if source2 is not None and seconds is None:
        raise ValueError("two sources need --seconds (the time between them)")
    if http_url is not None:
        candidates = [http_url]
    elif is_url(source) and seconds is None and source2 is None:
        candidates = []  # one snapshot has no rates, so no fill rate to read configs for
    else:
        candidates = guess_http_urls(source) if is_url(source) else []
    configs, config_error = await asyncio.to_thread(model_configs, candidates, max_batch_size)
    deriver = Deriver(TARGET, max_gap_s=math.inf)
    first = parse(await read_source(source))
    derived = deriver.derive(Snapshot(TARGET, 0.0, tuple(first)), configs)
    if seconds is None:
        return summarise(first, derived, None, config_error)
    if source2 is None:
        await asyncio.sleep(seconds)
        source2 = source
    second = parse(await read_source(source2))
    derived = deriver.derive(Snapshot(TARGET, seconds, tuple(second)), configs)
    result = summarise(second, derived, seconds, config_error)
    if not candidates and not max_batch_size and fill_unknown(result["models"]):
        result["config_error"] = (
            "max_batch_size unknown, so no fill rate: pass --max-batch-size MODEL=N, or "
            "--http-url http://HOST:PORT of the server these snapshots came from"
        )
    return result


def fill_unknown(models: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Models (``model`` or ``model/version``) that batch but have no fill rate: their
    ``max_batch_size`` was not known."""
    missing = []
    for model, slis in models.items():
        per_version = slis.get("versions")
        rows = per_version.items() if isinstance(per_version, Mapping) else [("", slis)]
        for version, values in rows:
            if "avg_batch_size" in values and "batch_fill_rate" not in values:
                missing.append(f"{model}/{version}" if version else model)
    return missing
