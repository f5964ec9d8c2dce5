"""Per-target scrape limits, as Prometheus's ``scrape_config`` has them.

``sample_limit``, ``label_limit``, ``label_name_length_limit`` and ``label_value_length_limit``
(``schemas.config.ScrapeLimits``; 0 is no limit) fail a scrape *as a whole*: the target's health
gives the reason in Prometheus's words (``sample limit exceeded (12345 > 10000)``), ``up`` is 0
and nothing of the scrape is stored or derived.  A partial scrape would leave rates and sums
over a random subset of the target's series, which is worse than a gap.

The sample count is checked before the body is parsed where a cheap line count already proves
it too high, so a hostile body of a million series is refused without building a million
label tuples.  Label limits depend only on a payload's structure, so they are checked once
per shape (``collector.shape``), not per scrape.  The series limit, a cap over time on what a
target creates in the store, is the store's (``Store.limit_series``).

Exceptions::

    ValueError
     └── LimitExceeded      .target, .reason (the health text), .samples (the scrape's count)
"""

from __future__ import annotations

from tritonwatch.collector.shape import Shape
from tritonwatch.schemas.config import ScrapeLimits
from tritonwatch.schemas.untrusted import log_safe

__all__ = ["LimitExceeded", "check_sample_count", "check_shape", "count_sample_lines"]

# How much of a metric name, label name or value a reason quotes (Prometheus quotes 50).
_QUOTE = 50


class LimitExceeded(ValueError):
    """A scrape broke one of its target's limits; ``reason`` is what its health says."""

    def __init__(self, target: str, reason: str, samples: int = 0) -> None:
        self.target = target
        self.reason = reason
        self.samples = samples
        super().__init__(f"scrape of {target!r} refused: {reason}")


def count_sample_lines(text: str) -> int:
    """How many samples the text format gives ``text``: its lines that are neither blank nor
    comments (every other line is one sample, or a parse error)."""
    return sum(
        1 for line in text.split("\n") if line.strip() and not line.lstrip().startswith("#")
    )


def check_sample_count(target: str, text: str, limits: ScrapeLimits) -> None:
    """Refuse a body with more than ``sample_limit`` samples before it is parsed.

    Costs two ``str.count`` calls unless the body may be over the limit: lines less comment
    lines bound the sample count from above.
    """
    limit = limits.sample_limit
    if not limit:
        return
    upper = text.count("\n") + 1 - text.count("\n#") - text.startswith("#")
    if upper <= limit:
        return
    n = count_sample_lines(text)
    if n > limit:
        raise LimitExceeded(target, sample_limit_reason(n, limit), n)


def sample_limit_reason(n: int, limit: int) -> str:
    return f"sample limit exceeded ({n} > {limit})"


def check_shape(shape: Shape, limits: ScrapeLimits) -> str | None:
    """The reason ``shape`` breaks a limit, or None; Prometheus's wording and order."""
    n = len(shape)
    if limits.sample_limit and n > limits.sample_limit:
        return sample_limit_reason(n, limits.sample_limit)
    max_labels = limits.label_limit
    max_name = limits.label_name_length_limit
    max_value = limits.label_value_length_limit
    if not (max_labels or max_name or max_value):
        return None
    checked: set[int] = set()  # label tuples are shared between a payload's series
    for name, labels in zip(shape.names, shape.labels, strict=True):
        if id(labels) in checked:
            continue
        checked.add(id(labels))
        if max_labels and len(labels) > max_labels:
            return (f"label_limit exceeded (metric: {log_safe(name, _QUOTE)}, number of labels: "
                    f"{len(labels)}, limit: {max_labels})")
        for label, value in labels:
            if max_name and len(label) > max_name:
                return (f"label_name_length_limit exceeded (metric: {log_safe(name, _QUOTE)}, "
                        f"label name: {log_safe(label, _QUOTE)}, length: {len(label)}, "
                        f"limit: {max_name})")
            if max_value and len(value) > max_value:
                return (f"label_value_length_limit exceeded (metric: {log_safe(name, _QUOTE)}, "
                        f"label name: {log_safe(label, _QUOTE)}, value: "
                        f"\"{log_safe(value, _QUOTE)}\", length: {len(value)}, limit: {max_value})")
    return None
