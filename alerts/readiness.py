"""``ModelNotReady``: a model Triton's repository index lists as loaded once, or one the config
expects (``targets[].expected_models``), and not ready now.

Reads ``triton_model_ready{model, version}`` (collector/triton.py, written on the API schedule):
an instance per (target, model, version) whose latest sample in the last ``window_s`` is 0.
The reason Triton gives (``triton_model_ready_reason``: state and reason, e.g. ``UNAVAILABLE``,
``unloaded``) goes in the annotations.  A model removed from the repository stops being read
and resolves once its last sample is older than the window; a target that is down is
TargetDown's, not this rule's (no new samples: the instance resolves after the window).
An expected model that was never loaded reads 0 with ``version=""`` and the reason "not
loaded"; it resolves as soon as a later reading finds the model ready in any version.

Labels: ``alertname=ModelNotReady``, ``target``, ``model``, ``version``, ``severity=critical``.
Built in: it runs whenever the built-in rules do (``defaults.enabled``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.samples import label_value, make_labels
from tritonwatch.store import Query

if TYPE_CHECKING:
    from tritonwatch.store import Store

READY = "triton_model_ready"
REASON = "triton_model_ready_reason"


class ModelNotReadyRule:
    """The built-in rule of the module docstring."""

    def __init__(self, *, for_s: float = 60.0, keep_firing_for_s: float = 0.0,
                 window_s: float = 300.0) -> None:
        self.name = "ModelNotReady"
        self.for_s = for_s
        self.keep_firing_for_s = keep_firing_for_s
        self.window_s = window_s

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        start = now - self.window_s
        down = []
        loaded: dict[tuple[str, str], float] = {}  # (target, model) -> when last read ready
        for s in store.read(Query(READY, start=start, end=now)).series():
            model = label_value(s.labels, "model")
            if s.values and s.values[-1] == 0.0:
                down.append((s.target, model, label_value(s.labels, "version"), s.ts[-1]))
            ready_at = [t for t, v in zip(s.ts, s.values, strict=True) if v == 1.0]
            if ready_at:
                at = (s.target, model)
                loaded[at] = max(loaded.get(at, ready_at[-1]), ready_at[-1])
        # An expected model "not loaded" (version "") that a later reading found loaded in
        # some version is no longer down, though its versionless series just stops.
        down = [d for d in down if d[2] or loaded.get((d[0], d[1]), -1.0) < d[3]]
        if not down:
            return []
        reasons: dict[tuple[str, str, str], tuple[float, str, str]] = {}
        for s in store.read(Query(REASON, start=start, end=now)).series():
            key = (s.target, label_value(s.labels, "model"), label_value(s.labels, "version"))
            seen = reasons.get(key)
            if seen is None or s.ts[-1] > seen[0]:
                reasons[key] = (s.ts[-1], label_value(s.labels, "state"),
                                label_value(s.labels, "reason"))
        out = []
        for target, model, version, _ in sorted(down):
            _, state, reason = reasons.get((target, model, version), (0.0, "", ""))
            labels = make_labels({"alertname": self.name, "target": target, "model": model,
                                  "version": version, "severity": "critical"})
            why = f"{state}: {reason}" if reason else state or "not ready"
            annotations = make_labels({
                "summary": (f"model {model} version {version} on {target} is not ready ({why})"
                            if version else
                            f"model {model} on {target} is expected and not loaded ({why})"),
                "state": state, "reason": reason,
            })
            out.append(AlertCandidate(labels, annotations, 0.0))
        return out
