"""What the threshold and forecast built-in rules (``alerts/capacity.py``,
``alerts/availability.py``) share: per-group means and sums of a window's samples, and their
alerts."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import ConfigDict

from tritonwatch.alerts.grouping import by_labels
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.samples import Labels, make_labels
from tritonwatch.store import Query

if TYPE_CHECKING:
    from tritonwatch.store import SeriesSums, Store

#: The labels of a model's series that identify it.
MODEL = ("model", "version")


@dataclass
class BuiltinRule:
    """What every threshold and forecast built-in rule has: its names, severity and timings
    (from ``alerts/builtin_rules.yaml``)."""

    # Built from alerts/builtin_rules.yaml through pydantic (alerts/defaults.py): a parameter
    # it does not know is an error, not ignored.
    __pydantic_config__ = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    name: str
    alertname: str
    severity: str
    for_s: float
    keep_firing_for_s: float

    def candidate(
        self, target: str, extra: Labels, value: float, summary: str, description: str,
        **figures: str,
    ) -> AlertCandidate:
        """An alert instance on ``target``; ``extra`` (the model, GPU, ...) names the instance
        beside the target.  Its annotations: ``summary``, ``description`` and the ``figures``
        that led to it (each formatted by the rule)."""
        lbl = {"alertname": self.alertname, "rule": self.name, "target": target,
               "severity": self.severity}
        lbl.update(dict(extra))
        annotations = {"summary": summary, "description": description, **figures}
        return AlertCandidate(make_labels(lbl), make_labels(annotations), value)


def means(
    store: Store, name: str, now: float, window: float, by: tuple[str, ...]
) -> dict[tuple[str, Labels], float]:
    """Mean over ``[now - window, now]`` of each group (target, ``by`` labels)."""
    return group_means(group_sums(
        store.finite_sums(Query(name, start=now - window, end=now)), by))


def group_means(acc: Mapping[tuple[str, Labels], list[float]]) -> dict[tuple[str, Labels], float]:
    """Each group's mean from its ``[sum, count]``; groups without a count are left out."""
    return {k: a[0] / a[1] for k, a in acc.items() if a[1]}


#: Up to this many targets, :func:`means_of` reads them one by one (a query each, of their
#: series only); more, all at once.
FEW_TARGETS = 8


def means_of(
    store: Store, name: str, now: float, window: float, by: tuple[str, ...],
    targets: Collection[str],
) -> dict[tuple[str, Labels], float]:
    """:func:`means` of ``targets``' groups only: what a rule reads for the few instances it
    alerts on (an annotation's figures), instead of every target's series on every
    evaluation.  The same numbers as :func:`means`: a target's series come in the same order
    either way, and are summed group by group in that order."""
    if len(targets) > FEW_TARGETS:
        return {k: v for k, v in means(store, name, now, window, by).items()
                if k[0] in targets}
    out: dict[tuple[str, Labels], float] = {}
    for target in sorted(targets):
        out.update(group_means(group_sums(
            store.finite_sums(Query(name, start=now - window, end=now, target=target)), by)))
    return out


def group_sums(
    sums: SeriesSums, by: tuple[str, ...], *, nonzero: bool = False
) -> dict[tuple[str, Labels], list[float]]:
    """Per group (target, ``by`` labels) of the series of ``sums`` (``Store.finite_sums``):
    ``[sum, count]`` of their finite points; a group whose series have none is there with
    zeros.  ``nonzero``: only the groups with a series whose sum is not zero (a healthy
    fleet's failure rates by reason are nearly all zero: 28,000 groups at 1,000 targets, each
    a key and a list, for the few that can alert)."""
    keys = sums.keys
    wanted = None
    if nonzero:
        wanted = {(keys[i].target, by_labels(keys[i].labels, by))
                  for i in np.flatnonzero(sums.sums).tolist()}
    acc: dict[tuple[str, Labels], list[float]] = {}
    for key, total, n in zip(keys, sums.sums.tolist(), sums.counts.tolist(), strict=True):
        group = (key.target, by_labels(key.labels, by))
        if wanted is not None and group not in wanted:
            continue
        a = acc.setdefault(group, [0.0, 0.0])
        a[0] += total
        a[1] += n
    return acc


