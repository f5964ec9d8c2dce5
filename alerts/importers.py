"""Import SLOs written for other tools: Sloth ``prometheus/v1`` and OpenSLO v1 ``kind: SLO``.

What maps is mapped: name, description, objective, period, labels, and (Sloth) the alert name,
labels, annotations and page/ticket switches.  SLI *queries* cannot be executed here — Tritonwatch
counts events from its own store — so only recognisable queries are translated:

- Triton's counters ``nv_inference_request_success`` / ``nv_inference_request_failure`` →
  an ``availability`` SLI (equality matchers on ``model``/``version`` kept, others into
  ``match``; a ``reason`` matcher is refused: the SLI counts failures of every reason);
- the probe histograms ``tritonwatch_probe_{ttft,itl}_seconds_bucket{le="T"}`` → a ``ttft`` /
  ``itl`` SLI with threshold T (matchers on ``probe``/``model`` kept, any other refused);
- ``tritonwatch_probe_errors`` / ``tritonwatch_probe_requests`` → a probe ``success`` SLI
  (likewise; e.g. the errors' ``kind`` is refused).

Sloth ``events`` queries and a Sloth ``raw.error_ratio_query`` are read alike: the metrics it
names decide the SLI.  Anything else is refused with a ``ConfigError`` line naming the field,
e.g. ``slos[0].sli.raw.error_ratio_query: cannot translate ...``; so is a matcher that would be
lost on the way, or that contradicts the same label's matcher in another query.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import ValidationError

from tritonwatch.schemas.config import ConfigError, error_lines
from tritonwatch.schemas.rules import SloSpec
from tritonwatch.schemas.values import parse_duration

_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_PROBE_LATENCY = re.compile(r"^tritonwatch_probe_(ttft|itl)_seconds_(bucket|count)$")
_PROBE_COUNTS = {"tritonwatch_probe_errors", "tritonwatch_probe_requests",
                 "tritonwatch_probe_errors_total", "tritonwatch_probe_requests_total"}
_TRITON = {"nv_inference_request_success", "nv_inference_request_failure"}
_UNTRANSLATABLE = (
    "cannot translate this query: Tritonwatch counts events from its store and recognises "
    "only nv_inference_request_success/failure (availability), "
    "tritonwatch_probe_{ttft,itl}_seconds_bucket{le=...} (latency) and "
    "tritonwatch_probe_errors/requests (probe success)"
)


class Imported(NamedTuple):
    """The SLOs translated from a file, and notes about what was dropped on the way."""

    slos: tuple[SloSpec, ...]
    notes: tuple[str, ...]


class _Refused(ValueError):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan"}
# Ranges (``[5m]``, ``[{{.window}}]``), grouping clauses and offsets name no metric.
_NOISE = re.compile(
    r"\[[^\]]*\]|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|"
    r"\boffset\s+\S+"
)


def _selectors(query: str) -> list[tuple[str, dict[str, str]]]:
    """Metric names and their matchers in a PromQL query (``=~``/``!=``/``!~`` refused)."""
    out = []
    text = _NOISE.sub(" ", query)
    for match in _SELECTOR.finditer(text):
        name, body = match.group(1), match.group(2)
        following = text[match.end():].lstrip()
        if name.lower() in _KEYWORDS or (not body and following.startswith("(")):
            continue  # a keyword or a function (sum, rate, ...)
        if match.start() > 0 and (text[match.start() - 1].isdigit()
                                  or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number
        matchers: dict[str, str] = {}
        inner = (body or "{}")[1:-1]
        pos = 0
        while pos < len(inner.strip()):
            m = _MATCHER.match(inner, pos)
            if not m:
                raise ValueError(f"cannot read the label matchers {body!r}")
            if m.group(2) != "=":
                raise ValueError(
                    f"matcher {m.group(0).strip().rstrip(',')!r}: only equality matchers "
                    "can be translated"
                )
            matchers[m.group(1)] = m.group(3)
            pos = m.end()
        out.append((name, matchers))
    return out


#: Label matchers each SLI kind can carry over (``le`` picks the latency threshold).
_KEPT = {
    "availability": ("model", "version"),
    "latency": ("probe", "model", "le"),
    "success": ("probe", "model"),
}


def _translated_sli(queries: Mapping[str, str]) -> dict[str, Any]:
    """:func:`_sli_from_queries`, its plain ValueError as a ``_Refused`` of the first query."""
    try:
        return _sli_from_queries(queries)
    except _Refused:
        raise
    except ValueError as exc:
        raise _Refused(next(iter(queries)), str(exc)) from None


def _sli_from_queries(queries: Mapping[str, str]) -> dict[str, Any]:
    """An SLI dict from named PromQL queries (field path → query), or ValueError.

    A ``_Refused`` names the query field at fault; a plain ValueError is about them all."""
    found: list[tuple[str, str, dict[str, str]]] = []
    for field, q in queries.items():
        try:
            found += [(field, name, m) for name, m in _selectors(q)]
        except ValueError as exc:
            raise _Refused(field, str(exc)) from None
    names = {name for _, name, _ in found}
    if names and names <= _TRITON:
        kind = "availability"
    elif names and all(_PROBE_LATENCY.match(n) for n in names):
        kind = "latency"
    elif names and names <= _PROBE_COUNTS:
        kind = "success"
    else:
        raise ValueError(_UNTRANSLATABLE)
    matchers: dict[str, str] = {}
    for field, _, m in found:
        for key, value in m.items():
            if key == "reason" and kind == "availability":
                # Our availability SLI counts the failures of every reason (schemas/rules.py):
                # dropping the matcher would widen the SLO, moving it into ``match`` would
                # also filter the success counter (no reason label) and count nothing.
                raise _Refused(field, f"matcher reason={value!r}: the availability SLI counts "
                                      "failures of every reason; a reason filter cannot be "
                                      "translated")
            if key not in _KEPT[kind] and kind != "availability":
                raise _Refused(field, f"matcher {key}={value!r}: only "
                                      f"{', '.join(k for k in _KEPT[kind] if k != 'le')} "
                                      "matchers can be translated for this SLI")
            if key == "le":
                continue  # checked below, per bucket series
            if matchers.get(key, value) != value:
                raise _Refused(field, f"matcher {key}={value!r} contradicts "
                                      f"{key}={matchers[key]!r} elsewhere in the SLI")
            matchers[key] = value
    if kind == "availability":
        sli: dict[str, Any] = {"kind": "availability"}
        for key in ("model", "version"):
            if key in matchers:
                sli[key] = matchers.pop(key)
        if matchers:  # other labels of Triton's series (e.g. a relabelled one): filters
            sli["match"] = matchers
        return sli
    if kind == "latency":
        kinds = {h.group(1) for n in names if (h := _PROBE_LATENCY.match(n))}
        les = {m["le"] for _, n, m in found if n.endswith("_bucket") and "le" in m}
        if len(kinds) != 1 or len(les) != 1:
            raise ValueError("a latency SLI needs one histogram and exactly one `le` bucket")
        return {"kind": kinds.pop(), "threshold": float(les.pop()),
                **{k: matchers[k] for k in ("probe", "model") if k in matchers}}
    return {"kind": "success", **{k: matchers[k] for k in ("probe", "model") if k in matchers}}


def _validate(data: Mapping[str, Any], where: str) -> SloSpec:
    try:
        return SloSpec.model_validate(data)
    except ValidationError as exc:
        raise ValueError("; ".join(f"{where}.{line}" for line in error_lines(exc))) from None


# --- Sloth -----------------------------------------------------------------------------------


def import_sloth(doc: Mapping[str, Any], *, window: str = "30d") -> Imported:
    """SLOs of a Sloth ``version: prometheus/v1`` spec; ``window`` is the period to assume
    (Sloth's spec has none: its CLI defaults to 30 days)."""
    errors: list[str] = []
    notes: list[str] = []
    out: list[SloSpec] = []
    service = str(doc.get("service") or "")
    common = {str(k): str(v) for k, v in (doc.get("labels") or {}).items()}
    if doc.get("slo_plugins"):
        notes.append("slo_plugins: ignored (no equivalent)")
    for i, slo in enumerate(doc.get("slos") or []):
        where = f"slos[{i}]"
        try:
            out.append(_sloth_slo(slo, where, service, common, window, notes))
        except ValueError as exc:
            errors.append(str(exc))
    return _imported("sloth", out, notes, errors, "slos: no SLO in the file")



def _imported(
    source: str, out: list[SloSpec], notes: list[str], errors: list[str], empty: str
) -> Imported:
    """What an importer found, or ``ConfigError`` with every error (``empty`` without any SLO)."""
    if not errors and not out:
        errors.append(empty)
    if errors:
        raise ConfigError(source, errors)
    return Imported(tuple(out), tuple(notes))

def _sloth_slo(
    slo: Mapping[str, Any], where: str, service: str, common: Mapping[str, str], window: str,
    notes: list[str],
) -> SloSpec:
    sli = slo.get("sli") or {}
    if "events" in sli:
        ev = sli["events"] or {}
        queries = {f"{where}.sli.events.{k}": str(ev.get(k) or "")
                   for k in ("error_query", "total_query")}
    elif "raw" in sli:
        queries = {f"{where}.sli.raw.error_ratio_query":
                   str((sli["raw"] or {}).get("error_ratio_query") or "")}
    elif "plugin" in sli:
        raise _Refused(f"{where}.sli.plugin", "SLI plugins cannot be translated")
    else:
        raise _Refused(f"{where}.sli", "expected one of events, raw, plugin")
    translated = _translated_sli(queries)
    if slo.get("plugins"):
        notes.append(f"{where}.plugins: ignored (no equivalent)")
    alerting = slo.get("alerting") or {}
    ours: dict[str, Any] = {}
    if alerting.get("name"):
        ours["name"] = alerting["name"]
    for key in ("labels", "annotations"):
        if alerting.get(key):
            ours[key] = {str(k): str(v) for k, v in alerting[key].items()}
    for theirs, mine in (("page_alert", "page"), ("ticket_alert", "ticket")):
        sev = alerting.get(theirs) or {}
        block: dict[str, Any] = {}
        if sev.get("disable"):
            block["enabled"] = False
        for key in ("labels", "annotations"):
            if sev.get(key):
                block[key] = {str(k): str(v) for k, v in sev[key].items()}
        if block:
            ours[mine] = block
    labels = {**common, **{str(k): str(v) for k, v in (slo.get("labels") or {}).items()}}
    if service:
        labels.setdefault("service", service)
    data: dict[str, Any] = {
        "name": f"{service}-{slo.get('name')}" if service else slo.get("name"),
        "description": str(slo.get("description") or ""),
        "objective": slo.get("objective"),
        "window": window,
        "labels": labels,
        "sli": translated,
    }
    if ours:
        data["alerting"] = ours
    return _validate(data, where)


# --- OpenSLO ---------------------------------------------------------------------------------

_PERIODS = {28 * 86400.0: "28d", 30 * 86400.0: "30d"}


def import_openslo(docs: Iterable[Mapping[str, Any]]) -> Imported:
    """The ``kind: SLO`` documents of OpenSLO ``openslo/v1`` YAML (``indicatorRef`` resolved
    against ``kind: SLI`` documents of the same file)."""
    docs = [d for d in docs if isinstance(d, Mapping)]
    slis = {str((d.get("metadata") or {}).get("name")): d.get("spec") or {}
            for d in docs if d.get("kind") == "SLI"}
    errors: list[str] = []
    notes: list[str] = []
    out: list[SloSpec] = []
    for i, doc in enumerate(docs):
        if doc.get("apiVersion") != "openslo/v1":
            errors.append(f"[{i}].apiVersion: expected openslo/v1, got {doc.get('apiVersion')!r}")
            continue
        if doc.get("kind") != "SLO":
            if doc.get("kind") != "SLI":
                notes.append(f"[{i}]: kind {doc.get('kind')} ignored")
            continue
        try:
            out.append(_openslo_slo(doc, f"[{i}]", slis, notes))
        except ValueError as exc:
            errors.append(str(exc))
    return _imported("openslo", out, notes, errors, "no kind: SLO document in the file")


def _openslo_slo(
    doc: Mapping[str, Any], where: str, slis: Mapping[str, Mapping[str, Any]], notes: list[str]
) -> SloSpec:
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    windows = spec.get("timeWindow") or [{}]
    if len(windows) != 1:
        raise _Refused(f"{where}.spec.timeWindow", "exactly one time window is supported")
    tw = windows[0]
    if tw.get("calendar") or not tw.get("isRolling", True):
        raise _Refused(f"{where}.spec.timeWindow[0]", "only rolling windows are supported")
    try:
        seconds = parse_duration(str(tw.get("duration", "30d")))
    except ValueError as exc:
        raise _Refused(f"{where}.spec.timeWindow[0].duration", str(exc)) from None
    if seconds not in _PERIODS:
        raise _Refused(f"{where}.spec.timeWindow[0].duration",
                       f"{tw.get('duration')!r}: only 28d (4w) and 30d are supported")
    method = spec.get("budgetingMethod", "Occurrences")
    if method != "Occurrences":
        raise _Refused(f"{where}.spec.budgetingMethod",
                       f"{method!r}: only Occurrences (event-based) can be translated")
    objectives = spec.get("objectives") or []
    if len(objectives) != 1:
        raise _Refused(f"{where}.spec.objectives", "exactly one objective is supported")
    obj = objectives[0]
    if "targetPercent" in obj:
        objective = float(obj["targetPercent"])
    elif "target" in obj:
        objective = float(obj["target"]) * 100.0
    else:
        raise _Refused(f"{where}.spec.objectives[0]", "needs target or targetPercent")
    if "indicator" in spec:
        indicator = (spec["indicator"] or {}).get("spec") or {}
        ipath = f"{where}.spec.indicator.spec"
    elif "indicatorRef" in spec:
        ref = str(spec["indicatorRef"])
        if ref not in slis:
            raise _Refused(f"{where}.spec.indicatorRef", f"no kind: SLI named {ref!r} in the file")
        indicator, ipath = slis[ref], f"{where}.spec.indicatorRef({ref})"
    else:
        raise _Refused(f"{where}.spec", "needs indicator or indicatorRef")
    ratio = indicator.get("ratioMetric")
    if not ratio:
        raise _Refused(f"{ipath}.thresholdMetric" if "thresholdMetric" in indicator
                       else ipath, "only ratioMetric indicators can be translated")
    queries = {}
    for part in ("good", "bad", "total"):
        if part in ratio:
            source = ((ratio[part] or {}).get("metricSource") or {}).get("spec") or {}
            queries[f"{ipath}.ratioMetric.{part}.metricSource.spec.query"] = str(
                source.get("query") or ""
            )
    if not queries:
        raise _Refused(f"{ipath}.ratioMetric", "needs good or bad, and total")
    translated = _translated_sli(queries)
    if spec.get("alertPolicies"):
        notes.append(f"{where}.spec.alertPolicies: replaced by the multiwindow burn-rate tiers")
    labels = {}
    for k, v in (meta.get("labels") or {}).items():
        labels[str(k)] = ",".join(map(str, v)) if isinstance(v, list) else str(v)
    if spec.get("service"):
        labels.setdefault("service", str(spec["service"]))
    data = {
        "name": meta.get("name"),
        "description": str(spec.get("description") or meta.get("displayName") or ""),
        "objective": objective,
        "window": _PERIODS[seconds],
        "labels": labels,
        "sli": translated,
    }
    return _validate(data, where)


# --- files -----------------------------------------------------------------------------------


def import_slo_file(path: str | Path, *, window: str = "30d") -> Imported:
    """Detect the format of ``path`` (Sloth or OpenSLO) and translate it."""
    source = str(path)
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8"))
                if d is not None]
    except OSError as exc:
        raise ConfigError(source, [f"cannot read file: {exc.strerror or exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"invalid YAML: {exc}"]) from None
    try:
        if len(docs) == 1 and isinstance(docs[0], Mapping) and \
                docs[0].get("version") == "prometheus/v1":
            return import_sloth(docs[0], window=window)
        if docs and all(isinstance(d, Mapping) and str(d.get("apiVersion", "")).startswith(
                "openslo/") for d in docs):
            return import_openslo(docs)
    except ConfigError as exc:
        raise ConfigError(source, exc.errors) from None
    raise ConfigError(source, [
        "(top level): neither a Sloth `version: prometheus/v1` spec nor OpenSLO "
        "`apiVersion: openslo/v1` documents"
    ])


def to_yaml(slos: Iterable[SloSpec]) -> str:
    """A rules file (``version: 1``) holding ``slos``, defaults left out."""
    specs = list(slos)
    items = [s.model_dump(mode="json", by_alias=True, exclude_defaults=True) for s in specs]
    for item, slo in zip(items, specs, strict=True):
        item["sli"]["kind"] = slo.sli.kind  # the discriminator is needed even when default
    return yaml.safe_dump({"version": 1, "slos": items}, sort_keys=False, allow_unicode=True)
