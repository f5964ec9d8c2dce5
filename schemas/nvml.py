"""Configuration of the NVML collector (GPU telemetry read from this machine's driver).

No I/O here.  The model is frozen, like every other configuration model, and is meant to sit
under the ``nvml:`` key of ``tritonwatch.yaml``::

    nvml:
      enabled: true
      interval: 15s
      host: gpu-node-7          # stored as the `target` of every NVML series
      labels: {rack: r12}

A host without NVML (no driver, no GPU) is not a configuration error: the collector reports one
``NVML unavailable: <reason>`` health entry and retries initialisation with an exponential
back-off between ``init_retry_min`` and ``init_retry_max``.
"""

from __future__ import annotations

import socket

from pydantic import Field, model_validator

from tritonwatch.schemas.values import Duration, Frozen, PositiveDuration


class NvmlConfig(Frozen):
    """The ``nvml:`` section: NVML collector schedule, identity and GPU-SLI thresholds."""

    enabled: bool = True
    """Collect NVML telemetry from the GPUs of the machine Tritonwatch runs on."""

    interval: PositiveDuration = 15.0
    """How often NVML is read (its own schedule, independent of the Triton scrapes)."""

    host: str = Field(default_factory=socket.gethostname, min_length=1)
    """Name of this machine; stored as the ``target`` of every NVML series and GPU SLI, and
    of the ``nvml`` health entry.  Defaults to the hostname."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels added to every NVML series (the collector's own labels win)."""

    init_retry_min: PositiveDuration = 30.0
    """First delay before NVML initialisation is retried after it failed."""

    init_retry_max: PositiveDuration = 300.0
    """Longest delay between initialisation retries (the back-off doubles up to this)."""

    pcie: bool = True
    """Read PCIe tx/rx throughput; NVML samples it for ~20 ms per direction per GPU."""

    xid_events: bool = True
    """Register for XID critical-error events where the driver supports event sets."""

    mig: bool = True
    """Report MIG instances (memory, processes) of GPUs in MIG mode."""

    idle_utilization_below: float = Field(default=0.1, gt=0.0, le=1.0)
    """A GPU counts as idle for ``sli:gpu_idle_while_queued`` below this utilization (0-1)."""

    queue_time_rise_min: Duration = 0.001
    """Rise of a model's average queue time between two readings (seconds) that counts as
    "rising queue time" for ``sli:gpu_idle_while_queued``."""

    @model_validator(mode="after")
    def _retry_bounds(self) -> NvmlConfig:
        if self.init_retry_min > self.init_retry_max:
            raise ValueError("init_retry_min must not exceed init_retry_max")
        return self
