"""The real NvmlCollector against the real NVML: only on a machine with an NVIDIA GPU.

Marked ``gpu``; deselect with ``-m "not gpu"`` where there is none.  The module imports cleanly
without a GPU (pynvml loads the library only in ``nvmlInit``).  Run with ``-s`` to print the
readings for the record.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest

from tritonwatch.collector.nvml import NvmlCollector
from tritonwatch.schemas.samples import Sample, label_value

pytestmark = pytest.mark.gpu


def _smi_uuids() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.fail("nvidia-smi not found on a machine marked as having a GPU")
    text = subprocess.run([smi, "-L"], check=True, capture_output=True, text=True,
                          timeout=60).stdout
    # "GPU 0: NVIDIA H200 (UUID: GPU-...)"; MIG lines carry "MIG-..." UUIDs and are indented.
    return re.findall(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)", text, re.MULTILINE)


def _per_gpu(samples: list[Sample], name: str) -> dict[str, float]:
    return {label_value(s.labels, "gpu_uuid"): s.value for s in samples
            if s.name == name and not label_value(s.labels, "mig_uuid")}


def test_real_nvml_readings_are_sane() -> None:
    collector = NvmlCollector("gpu-test", clock=time.time)
    try:
        samples, health = collector.collect()
        samples2, _ = collector.collect()
    finally:
        collector.close()
    print(f"\nhealth: {health}")  # noqa: T201 - quoted in the issue as evidence
    for s in sorted(samples, key=lambda x: (x.name, x.labels)):
        print(f"{s.name}{dict(s.labels)} {s.value:g}")  # noqa: T201
    assert health.up, health.error
    assert health.error is None
    assert health.samples == len(samples) > 0

    uuids = _smi_uuids()
    assert uuids
    assert sorted(_per_gpu(samples, "nvml_gpu_up")) == sorted(uuids)
    assert set(_per_gpu(samples, "nvml_gpu_up").values()) == {1.0}

    util = _per_gpu(samples, "nvml_gpu_utilization_ratio")
    assert util.keys() == set(uuids)
    for ratio in util.values():
        assert 0 <= ratio * 100 <= 100  # NVML's percentage, 0-100
    mem_util = _per_gpu(samples, "nvml_gpu_memory_utilization_ratio")
    assert all(0 <= r <= 1 for r in mem_util.values())

    used = _per_gpu(samples, "nvml_gpu_memory_used_bytes")
    total = _per_gpu(samples, "nvml_gpu_memory_total_bytes")
    assert used.keys() == total.keys() == set(uuids)
    for uuid in uuids:
        assert 0 <= used[uuid] <= total[uuid]
        assert total[uuid] > 1024**3

    power = _per_gpu(samples, "nvml_gpu_power_watts")
    limit = _per_gpu(samples, "nvml_gpu_power_limit_watts")
    for uuid, watts in power.items():
        assert 0 < watts < 2000
        if uuid in limit:
            assert 0 < limit[uuid] < 2000
    for celsius in _per_gpu(samples, "nvml_gpu_temperature_celsius").values():
        assert 0 < celsius < 120
    for hz in _per_gpu(samples, "nvml_gpu_sm_clock_hertz").values():
        assert 0 <= hz < 5e9
    energy1 = _per_gpu(samples, "nvml_gpu_energy_joules")
    energy2 = _per_gpu(samples2, "nvml_gpu_energy_joules")
    for uuid, joules in energy1.items():
        assert 0 <= joules <= energy2[uuid]
    for mask in _per_gpu(samples, "nvml_gpu_clocks_event_reasons").values():
        assert mask >= 0 and mask == int(mask)
    for procs in _per_gpu(samples, "nvml_gpu_compute_processes").values():
        assert procs >= 0
