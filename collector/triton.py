"""Triton's model-config and statistics APIs, read through tritonclient.

Both APIs are polled on their own schedule (``scrape.api_interval``), slower than /metrics:
configs rarely change, and the statistics extension walks every model on the server.

Everything the statistics API returns is cumulative since the model loaded, so it is turned
into counter samples (families ``triton_stats_*``) and goes through the same reset-aware
deriver as /metrics.  Two quirks are handled here, once:

* gRPC's JSON (protobuf mapping) renders uint64 as strings, HTTP as numbers: ``_int`` takes both.
* ``batch_stats`` entries have no top-level ``count``; the executions of a batch size are the
  ``compute_infer.count`` of its entry.
* In EXPLICIT model-control mode the repository index lists unloaded models without a
  ``state``; only ``READY`` models are read, and a model whose config cannot be read (unloaded
  between the index and the config call) is skipped rather than failing the whole reading.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from tritonwatch.collector.grpc_options import channel_args
from tritonwatch.schemas.samples import MetricFamily, Sample, Snapshot, make_labels
from tritonwatch.schemas.triton import ModelConfigInfo
from tritonwatch.schemas.untrusted import log_safe

log = logging.getLogger(__name__)


class TritonApiError(ConnectionError):
    def __init__(self, target: str, message: str) -> None:
        self.target = target
        self.reason = message
        super().__init__(f"Triton API of {target!r}: {message}")


def _int(value: Any, default: int = 0) -> int:
    if value is None or value == "":
        return default
    return int(value)


def parse_model_config(config: Mapping[str, Any]) -> ModelConfigInfo:
    """ModelConfigInfo from model-config JSON (HTTP, or gRPC's ``{"config": {...}}``)."""
    if "config" in config and isinstance(config["config"], Mapping):
        config = config["config"]
    dyn = config.get("dynamic_batching")
    groups = config.get("instance_group") or []
    policy = config.get("model_transaction_policy") or {}
    queue_policy = (dyn or {}).get("default_queue_policy") or {}
    return ModelConfigInfo(
        name=str(config.get("name", "")),
        max_batch_size=_int(config.get("max_batch_size")),
        preferred_batch_sizes=tuple(
            sorted(_int(v) for v in (dyn or {}).get("preferred_batch_size", []))
        ),
        max_queue_delay_us=_int(dyn.get("max_queue_delay_microseconds")) if dyn is not None
        else None,
        instance_count=sum(_int(g.get("count"), 1) for g in groups) if groups else 1,
        instance_kinds=tuple(str(g.get("kind", "KIND_AUTO")) for g in groups),
        decoupled=bool(policy.get("decoupled", False)),
        backend=str(config.get("backend", "")),
        platform=str(config.get("platform", "")),
        max_queue_size=_int(queue_policy.get("max_queue_size")) or None,
    )


_INFERENCE_STATS = ("success", "fail", "queue", "compute_input", "compute_infer",
                    "compute_output", "cache_hit", "cache_miss")


def stats_families(stats: Mapping[str, Any]) -> tuple[MetricFamily, ...]:
    """Counter families ``triton_stats_*`` from a statistics response (HTTP or gRPC JSON)."""
    out: dict[str, list[Sample]] = {}

    def add(name: str, labels: Iterable[tuple[str, str]], value: Any) -> None:
        out.setdefault(name, []).append(Sample(name, make_labels(labels), float(_int(value))))

    for model in stats.get("model_stats", []):
        base = (("model", str(model.get("name", ""))), ("version", str(model.get("version", ""))))
        add("triton_stats_inference_count", base, model.get("inference_count"))
        add("triton_stats_execution_count", base, model.get("execution_count"))
        inference = model.get("inference_stats") or {}
        for key in _INFERENCE_STATS:
            entry = inference.get(key) or {}
            add(f"triton_stats_{key}_count", base, entry.get("count"))
            add(f"triton_stats_{key}_ns", base, entry.get("ns"))
        for batch in model.get("batch_stats") or []:
            labels = (*base, ("batch_size", str(_int(batch.get("batch_size")))))
            infer = batch.get("compute_infer") or {}
            add("triton_stats_batch_executions", labels, infer.get("count"))
            add("triton_stats_batch_compute_infer_ns", labels, infer.get("ns"))
        for index, response in (model.get("response_stats") or {}).items():
            labels = (*base, ("index", str(index)))
            success = response.get("success") or {}
            add("triton_stats_response_success_count", labels, success.get("count"))
            add("triton_stats_response_success_ns", labels, success.get("ns"))
            empty = response.get("empty_response") or {}
            add("triton_stats_response_empty_count", labels, empty.get("count"))
    return tuple(
        MetricFamily(name, "counter", "from Triton's statistics API", tuple(samples))
        for name, samples in out.items()
    )


class ApiReading(NamedTuple):
    configs: dict[str, ModelConfigInfo]
    raw_configs: dict[str, dict[str, Any]]
    stats: Snapshot
    duration_s: float
    readiness: tuple[Sample, ...] = ()


#: Longest reason text kept with a model that is not ready.
REASON_MAX = 200


#: The reason given for an expected model that the index does not list as loaded.
NOT_LOADED = "not loaded"


def readiness_samples(live: bool, ready: bool, index: Iterable[Mapping[str, Any]],
                      expected: Iterable[str] = ()) -> tuple[Sample, ...]:
    """Readiness as series: ``triton_server_live``, ``triton_server_ready`` (0/1), and per
    model version of the repository index ``triton_model_ready{model, version}`` (1 when its
    state is READY), plus ``triton_model_ready_reason{model, version, state, reason}`` = 1
    while it is not.

    A model the index lists without a version or state (EXPLICIT model-control mode: in the
    repository, never loaded) is not expected to be ready and gets no series, unless it is in
    ``expected`` (``targets[].expected_models``); one that was loaded and then unloaded or
    failed is listed with its version, state and reason.  An expected model with no version
    in the index (absent, or listed without one) reads 0 with ``version=""`` and the reason
    "not loaded", so ModelNotReady fires for it; its state is the index's, or ``ABSENT``.
    """
    out = [Sample("triton_server_live", (), 1.0 if live else 0.0),
           Sample("triton_server_ready", (), 1.0 if ready else 0.0)]
    seen: set[tuple[str, str]] = set()
    versioned: set[str] = set()
    unversioned: dict[str, str] = {}
    for m in index:
        name, version = str(m.get("name") or ""), str(m.get("version") or "")
        state = str(m.get("state") or "").upper()
        if name and not version:
            unversioned.setdefault(name, state)
        if not name or not version or not state or (name, version) in seen:
            continue
        seen.add((name, version))
        versioned.add(name)
        labels = make_labels({"model": name, "version": version})
        up = state == "READY"
        out.append(Sample("triton_model_ready", labels, 1.0 if up else 0.0))
        if not up:
            reason = log_safe(str(m.get("reason") or ""), REASON_MAX)
            out.append(Sample("triton_model_ready_reason", make_labels(
                {"model": name, "version": version, "state": state, "reason": reason}), 1.0))
    for name in sorted(set(expected) - versioned):
        state = log_safe(unversioned.get(name) or "ABSENT", REASON_MAX)
        out.append(Sample("triton_model_ready", make_labels({"model": name, "version": ""}),
                          0.0))
        out.append(Sample("triton_model_ready_reason", make_labels(
            {"model": name, "version": "", "state": state, "reason": NOT_LOADED}), 1.0))
    return tuple(out)


class TritonApi:
    """Blocking tritonclient calls for one target; ``read`` runs them in a worker thread."""

    def __init__(
        self,
        target: str,
        *,
        http_url: str | None,
        grpc_url: str | None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        expected_models: Iterable[str] = (),
    ) -> None:
        if not http_url and not grpc_url:
            raise ValueError(f"target {target!r} has neither http_url nor grpc_url")
        self.target = target
        self._http_url = http_url
        self._grpc_url = grpc_url
        self._headers = dict(headers or {})
        self._timeout = timeout
        self._expected = tuple(expected_models)
        self._client: Any = None

    def _connect(self) -> Any:
        if self._client is None:
            if self._http_url:
                import tritonclient.http as httpclient

                parts = urlsplit(self._http_url)
                self._client = httpclient.InferenceServerClient(
                    url=parts.netloc,
                    ssl=parts.scheme == "https",
                    connection_timeout=self._timeout,
                    network_timeout=self._timeout,
                )
            else:
                import tritonclient.grpc as grpcclient

                self._client = grpcclient.InferenceServerClient(
                    url=self._grpc_url, channel_args=channel_args()
                )
        return self._client

    def _call(self, method: str, *args: Any, as_json: bool = True) -> Any:
        client = self._connect()
        kwargs: dict[str, Any] = {"headers": self._headers or None}
        if not self._http_url:
            if as_json:
                kwargs["as_json"] = True
            kwargs["client_timeout"] = self._timeout
        try:
            return getattr(client, method)(*args, **kwargs)
        except Exception as exc:  # tritonclient raises its own exception type per protocol
            message = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            self.close()
            raise TritonApiError(self.target, f"{method}: {message}") from None

    def read_blocking(self, now: float) -> ApiReading:
        # A client per reading: tritonclient.http's gevent pool must not cross threads, and
        # asyncio.to_thread may run each reading on a different worker thread.
        try:
            return self._read(now)
        finally:
            self.close()

    def _read(self, now: float) -> ApiReading:
        start = time.perf_counter()
        # Triton's health APIs (GET v2/health/live, v2/health/ready), as the blackbox exporter
        # or Kubernetes probes would read them.
        live = bool(self._call("is_server_live", as_json=False))
        server_ready = bool(self._call("is_server_ready", as_json=False))
        index = self._call("get_model_repository_index")
        if isinstance(index, Mapping):  # gRPC as_json
            index = index.get("models", [])
        # Only READY models have a config to read.  In EXPLICIT model-control mode the index
        # also lists models that are not loaded, without any ``state``: those are not ready.
        ready = sorted(
            {str(m["name"]) for m in index if str(m.get("state") or "").upper() == "READY"}
        )
        raw_configs: dict[str, dict[str, Any]] = {}
        configs: dict[str, ModelConfigInfo] = {}
        for name in ready:
            try:
                raw = self._call("get_model_config", name)
            except TritonApiError as exc:
                # Unloaded between the index and now (or otherwise gone): skip this model,
                # keep the reading of the others.
                log.info("%s: no config for model %s, skipped: %s", self.target,
                         log_safe(repr(name)), log_safe(exc.reason))
                continue
            raw = dict(raw.get("config", raw))
            raw_configs[name] = raw
            configs[name] = parse_model_config(raw)
        stats = self._call("get_inference_statistics")
        snapshot = Snapshot(self.target, now, stats_families(stats))
        return ApiReading(configs, raw_configs, snapshot, time.perf_counter() - start,
                          readiness_samples(live, server_ready, index, self._expected))

    async def read(self, now: float) -> ApiReading:
        return await asyncio.to_thread(self.read_blocking, now)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken client must not mask the original error
                pass
