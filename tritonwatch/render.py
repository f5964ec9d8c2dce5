"""Terminal rendering (rich tables) shared by ``inspect``, ``probe`` and the demo's live view."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

#: Console width when the output is not a terminal: wide enough that no table is ever wrapped
#: or cut (rich would otherwise assume 80 columns for a pipe or a file).
PIPE_WIDTH = 100_000


def make_console(*, stderr: bool = False) -> Console:
    """A console for stdout (or stderr): the terminal's width on a terminal; on a pipe or a
    file, tables at their natural width and no colour codes."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PIPE_WIDTH)

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


#: Shown in a cell whose value could not be computed for a reason the table's note gives.
UNKNOWN = "?"


def model_table(
    models: Mapping[str, Mapping[str, Any]],
    title: str,
    versions: Mapping[str, Sequence[str]] | None = None,
    unknown: frozenset[str] = frozenset(),
) -> Table:
    """A row per model, or per model version when ``versions`` is given or a model has several
    (the ``models`` / ``model_versions`` of ``tritonwatch inspect --json``).

    ``unknown``: SLI keys whose column is shown even where no row has a value, with
    :data:`UNKNOWN` in the cells of batching models (the fill rate when max_batch_size could
    not be read), so a missing column is never silent.
    """
    rows = model_rows(models, versions)
    table = Table(title=title, title_justify="left")
    table.add_column("model")
    show_version = versions is not None or any(
        isinstance(slis.get("versions"), Mapping) for slis in models.values()
    )
    if show_version:
        table.add_column("version")
    present = [c for c in MODEL_COLUMNS if any(
        c[0] in slis or (c[0] in unknown and "avg_batch_size" in slis) for _, _, slis in rows
    )]
    for _, header, _ in present:
        table.add_column(header, justify="right")

    def cell(key: str, pattern: str, slis: Mapping[str, Any]) -> str:
        if key in unknown and key not in slis and "avg_batch_size" in slis:
            return UNKNOWN
        return fmt(key, slis.get(key), pattern)

    for model, version, slis in rows:
        cells = (cell(k, p, slis) for k, _, p in present)
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
    console = console or make_console()
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
    # A fill rate that could not be computed shows as "?" with the reason below, not as a
    # column that silently disappears.
    unknown = frozenset({"batch_fill_rate"}) if result.get("config_error") and interval else (
        frozenset())
    if result["models"]:
        console.print(model_table(result["models"], title, result.get("model_versions", {}),
                                  unknown=unknown))
    if result["gpus"]:
        console.print(gpu_table(result["gpus"]))
    if result.get("config_error"):
        console.print(f"[yellow]fill rate unavailable:[/] {escape(result['config_error'])}",
                      highlight=False)
