"""Terminal rendering (rich tables) shared by ``inspect`` and the demo's live view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

# Columns shown per model, in order: (SLI key, header, format).
MODEL_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("request_rate", "req/s", "{:.1f}"),
    ("success_ratio", "success", "{:.1%}"),
    ("avg_batch_size", "batch", "{:.2f}"),
    ("batch_fill_rate", "fill", "{:.0%}"),
    ("preferred_batch_hit_ratio", "pref hit", "{:.0%}"),
    ("queue_time_seconds", "queue ms", "{:.2f}"),
    ("compute_time_seconds", "compute ms", "{:.2f}"),
    ("pending_requests", "pending", "{:.0f}"),
    ("kv_cache_utilization", "KV used", "{:.0%}"),
    ("inflight_batch_fill", "IFB fill", "{:.0%}"),
    ("llm_waiting_requests", "waiting", "{:.0f}"),
)
_MS = frozenset({"queue_time_seconds", "compute_time_seconds"})


def fmt(key: str, value: float | None, pattern: str) -> str:
    if value is None:
        return "-"
    return pattern.format(value * 1000 if key in _MS else value)


def model_rows(
    models: Mapping[str, Mapping[str, Any]], versions: Mapping[str, Sequence[str]] | None = None
) -> list[tuple[str, str, Mapping[str, Any]]]:
    """``(model, version, SLIs)`` per table row: one per version of a model served in several
    (``{"versions": {...}}``, see ``tritonwatch.inspect``), else one per model, its version
    taken from ``versions`` when known."""
    rows = []
    for model, slis in models.items():
        per_version = slis.get("versions")
        if isinstance(per_version, Mapping):
            rows += [(model, str(v), vs) for v, vs in per_version.items()]
        else:
            known = (versions or {}).get(model) or [""]
            rows.append((model, ", ".join(known), slis))
    return rows


def model_table(
    models: Mapping[str, Mapping[str, Any]],
    title: str,
    versions: Mapping[str, Sequence[str]] | None = None,
) -> Table:
    """A row per model, or per model version when ``versions`` is given or a model has several
    (the ``models`` / ``model_versions`` of ``tritonwatch inspect --json``)."""
    rows = model_rows(models, versions)
    table = Table(title=title, title_justify="left")
    table.add_column("model")
    show_version = versions is not None or any(
        isinstance(slis.get("versions"), Mapping) for slis in models.values()
    )
    if show_version:
        table.add_column("version")
    present = [c for c in MODEL_COLUMNS if any(c[0] in slis for _, _, slis in rows)]
    for _, header, _ in present:
        table.add_column(header, justify="right")
    for model, version, slis in rows:
        cells = (fmt(k, slis.get(k), p) for k, _, p in present)
        table.add_row(model, *((version,) if show_version else ()), *cells)
    return table


def gpu_table(gpus: Mapping[str, Mapping[str, float | None]]) -> Table:
    table = Table(title="GPUs", title_justify="left")
    for header in ("gpu_uuid", "util", "memory", "power"):
        table.add_column(header, justify="right" if header != "gpu_uuid" else "left")
    for uuid, slis in gpus.items():
        table.add_row(
            uuid,
            fmt("", slis.get("gpu_utilization"), "{:.0%}"),
            fmt("", slis.get("gpu_memory_used_ratio"), "{:.0%}"),
            fmt("", slis.get("gpu_power_ratio"), "{:.0%}"),
        )
    return table


def render_inspect(result: Mapping[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    families = Table(title=f"{len(result['families'])} families, {result['series']} series",
                     title_justify="left")
    families.add_column("family")
    families.add_column("type")
    families.add_column("series", justify="right")
    for family in result["families"]:
        families.add_row(family["name"], family["type"], str(family["series"]))
    console.print(families)
    interval = result.get("interval_s")
    title = f"models (over {interval:g} s)" if interval else "models (single snapshot: gauges)"
    if result["models"]:
        console.print(model_table(result["models"], title, result.get("model_versions", {})))
    if result["gpus"]:
        console.print(gpu_table(result["gpus"]))
    if result.get("config_error"):
        console.print(f"[yellow]model configs unavailable:[/] {result['config_error']}")
