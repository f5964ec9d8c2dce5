"""What Tritonwatch keeps of a Triton model's configuration (from the model-config API).

No I/O.  ``collector/triton.py`` builds these from the HTTP or gRPC JSON; ``collector/derive.py``
reads ``max_batch_size`` (the fill-rate denominator) and ``preferred_batch_sizes`` from them.
"""

from __future__ import annotations

from typing import NamedTuple


class ModelConfigInfo(NamedTuple):
    name: str
    max_batch_size: int  # 0: the model has no batch dimension, fill rate is N/A
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int | None = None  # None: no dynamic batcher
    instance_count: int = 1
    instance_kinds: tuple[str, ...] = ()
    decoupled: bool = False
    backend: str = ""
    platform: str = ""
    max_queue_size: int | None = None
