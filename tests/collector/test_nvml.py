"""collector/nvml.py through ``FakePynvml``, a stand-in for the pynvml module.

``FakePynvml`` is the only fake here (no GPU on these machines): it answers with recorded H100
readings and raises the *real* pynvml error classes, built the way pynvml builds them
(``pynvml.NVMLError(code)`` returns the matching subclass).  One test checks that every NVML
function the collector calls is exercised; another runs the real pynvml on this machine.
"""

from __future__ import annotations

import itertools
import logging
import re
import sys
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
import pynvml
import pytest

from tests.clock import Clock
from tritonwatch.collector import nvml as nvml_mod
from tritonwatch.collector.nvml import (
    CLOCK_EVENT_REASONS,
    NvmlCollector,
    decode_clock_reasons,
)
from tritonwatch.schemas.nvml import NvmlConfig
from tritonwatch.schemas.samples import Sample, label_value


def nvml_error(code: int) -> pynvml.NVMLError:
    err = pynvml.NVMLError(code)
    assert type(err) is not pynvml.NVMLError  # really the subclass
    return err


def not_supported() -> pynvml.NVMLError:
    return nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)


UUID0 = "GPU-6d4b5b1a-2f8c-2c3e-9e2b-1f1a6c0d7a11"
UUID1 = "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"
GIB = 1024**3


def h100(uuid: str | bytes, **overrides: Any) -> dict[str, Any]:
    """Readings recorded from an H100 SXM under load (values as pynvml returns them)."""
    record: dict[str, Any] = {
        "uuid": uuid,
        "name": "NVIDIA H100 80GB HBM3",
        "utilization": SimpleNamespace(gpu=87, memory=43),
        "memory": SimpleNamespace(total=80 * GIB, free=30 * GIB, used=50 * GIB),
        "power": 350_500,  # mW
        "power_limit": 700_000,  # mW
        "energy": 123_456_789,  # mJ
        "temperature": 61,  # C
        "clock": {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619},  # MHz
        "reasons": 0x4 | 0x1,  # sw_power_cap + gpu_idle
        "ecc": {(0, 0): 0, (0, 1): 12, (1, 0): 0, (1, 1): 1},
        "pcie": {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1000, pynvml.NVML_PCIE_UTIL_RX_BYTES: 2000},
        "processes": [SimpleNamespace(pid=4242, usedGpuMemory=40 * GIB),
                      SimpleNamespace(pid=4243, usedGpuMemory=10 * GIB)],
        "mig_mode": not_supported(),
        "register_events": None,
    }
    record.update(overrides)
    return record


class Handle:
    def __init__(self, index: int, slot: int | None = None) -> None:
        self.index, self.slot = index, slot


class FakePynvml:
    """FAKE pynvml module: recorded readings, real ``pynvml.NVMLError_*`` exceptions.

    A reading that is an exception instance is raised; ``init_errors`` are raised by
    successive ``nvmlInit`` calls (then it succeeds).  ``calls`` counts calls per function.
    """

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, gpus: list[dict[str, Any]], *, init_errors: list[Any] | None = None,
                 mig: dict[int, list[dict[str, Any] | None]] | None = None) -> None:
        self.gpus = gpus
        self.mig = mig or {}
        self.init_errors = deque(init_errors or [])
        self.count: Any = None  # None: len(gpus); an exception: raised
        self.events: deque[Any] = deque()
        self.calls: Counter[str] = Counter()
        self.wait_timeouts: list[int] = []

    def _rec(self, handle: Handle) -> dict[str, Any]:
        if handle.slot is None:
            return self.gpus[handle.index]
        mig = self.mig[handle.index][handle.slot]
        assert mig is not None
        return mig

    def _get(self, fn: str, handle: Handle, key: str, *sub: Any) -> Any:
        self.calls[fn] += 1
        value = self._rec(handle)[key]
        for part in sub:
            if isinstance(value, BaseException):
                break
            value = value[part]
        if isinstance(value, BaseException):
            raise value
        return value

    # library
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_errors:
            raise self.init_errors.popleft()

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        if isinstance(self.count, BaseException):
            raise self.count
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        lost = self.gpus[index].get("handle_error")
        if lost is not None:
            raise lost
        return Handle(index)

    # readings
    def nvmlDeviceGetUUID(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetUUID", h, "uuid")

    def nvmlDeviceGetName(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetName", h, "name")

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetUtilizationRates", h, "utilization")

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetMemoryInfo", h, "memory")

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetPowerUsage", h, "power")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetEnforcedPowerLimit", h, "power_limit")

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetTotalEnergyConsumption", h, "energy")

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> Any:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._get("nvmlDeviceGetTemperature", h, "temperature")

    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> Any:
        return self._get("nvmlDeviceGetClockInfo", h, "clock", clock)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetCurrentClocksEventReasons", h, "reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetCurrentClocksThrottleReasons", h, "reasons")

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, etype: int, counter: int) -> Any:
        return self._get("nvmlDeviceGetTotalEccErrors", h, "ecc", (etype, counter))

    def nvmlDeviceGetPcieThroughput(self, h: Handle, counter: int) -> Any:
        return self._get("nvmlDeviceGetPcieThroughput", h, "pcie", counter)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetComputeRunningProcesses", h, "processes")

    # MIG
    def nvmlDeviceGetMigMode(self, h: Handle) -> Any:
        return self._get("nvmlDeviceGetMigMode", h, "mig_mode")

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        self.calls["nvmlDeviceGetMaxMigDeviceCount"] += 1
        return len(self.mig[h.index])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, slot: int) -> Handle:
        self.calls["nvmlDeviceGetMigDeviceHandleByIndex"] += 1
        if self.mig[h.index][slot] is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(h.index, slot)

    # events
    def nvmlEventSetCreate(self) -> str:
        self.calls["nvmlEventSetCreate"] += 1
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, event_set: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError and event_set == "event-set"
        return self._get("nvmlDeviceRegisterEvents", h, "register_events")  # type: ignore[no-any-return]

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        self.calls["nvmlEventSetWait"] += 1
        self.wait_timeouts.append(timeout_ms)
        if not self.events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.calls["nvmlEventSetFree"] += 1


T0 = 1_700_000_000.0


def by_name(samples: list[Sample], series: str, /, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == series
            and all(label_value(s.labels, k) == v for k, v in labels.items())]


def value(samples: list[Sample], series: str, /, **labels: str) -> float:
    found = by_name(samples, series, **labels)
    assert len(found) == 1, (series, labels, found)
    return found[0].value


def collector(fake: FakePynvml, clock: Clock | None = None, **kw: Any) -> NvmlCollector:
    return NvmlCollector("gpu-node-7", clock=clock or Clock(T0), nvml_module=fake, **kw)


# --- readings ------------------------------------------------------------------------------------


def test_every_reading_of_a_gpu_is_a_series_in_base_units() -> None:
    fake = FakePynvml([h100(UUID0)])
    samples, health = collector(fake).collect()
    assert health.up and health.error is None and health.source == "nvml"
    assert health.target == "gpu-node-7" and health.samples == len(samples)
    assert health.ts == T0
    assert all(label_value(s.labels, "gpu_uuid") == UUID0 for s in samples)
    assert all(label_value(s.labels, "index") == "0" for s in samples)
    assert value(samples, "nvml_gpu_up") == 1.0
    assert value(samples, "nvml_gpu_info", name="NVIDIA H100 80GB HBM3") == 1.0
    assert value(samples, "nvml_gpu_utilization_ratio") == pytest.approx(0.87)
    assert value(samples, "nvml_gpu_memory_utilization_ratio") == pytest.approx(0.43)
    assert value(samples, "nvml_gpu_memory_used_bytes") == 50 * GIB
    assert value(samples, "nvml_gpu_memory_total_bytes") == 80 * GIB
    assert value(samples, "nvml_gpu_power_watts") == pytest.approx(350.5)
    assert value(samples, "nvml_gpu_power_limit_watts") == pytest.approx(700.0)
    assert value(samples, "nvml_gpu_energy_joules") == pytest.approx(123_456.789)
    assert value(samples, "nvml_gpu_temperature_celsius") == 61.0
    assert value(samples, "nvml_gpu_sm_clock_hertz") == 1980e6
    assert value(samples, "nvml_gpu_memory_clock_hertz") == 2619e6
    assert value(samples, "nvml_gpu_clocks_event_reasons") == 0x5
    assert value(samples, "nvml_gpu_clocks_event_active", reason="sw_power_cap") == 1.0
    assert value(samples, "nvml_gpu_clocks_event_active", reason="gpu_idle") == 1.0
    assert value(samples, "nvml_gpu_clocks_event_active", reason="hw_slowdown") == 0.0
    assert len(by_name(samples, "nvml_gpu_clocks_event_active")) == len(CLOCK_EVENT_REASONS)
    assert value(samples, "nvml_gpu_ecc_errors", error_type="corrected", counter="volatile") == 0
    assert value(samples, "nvml_gpu_ecc_errors", error_type="corrected", counter="aggregate") == 12
    assert value(samples, "nvml_gpu_ecc_errors", error_type="uncorrected",
                 counter="aggregate") == 1
    assert value(samples, "nvml_gpu_pcie_tx_bytes_per_second") == 1000 * 1024
    assert value(samples, "nvml_gpu_pcie_rx_bytes_per_second") == 2000 * 1024
    assert value(samples, "nvml_gpu_compute_processes") == 2
    assert value(samples, "nvml_gpu_xid_errors") == 0
    assert value(samples, "nvml_gpu_last_xid") == 0
    # labels are canonical (sorted) tuples
    assert all(s.labels == tuple(sorted(s.labels)) for s in samples)


def test_uuid_returned_as_bytes_by_old_pynvml_is_decoded() -> None:
    fake = FakePynvml([h100(UUID0.encode(), name=b"Tesla T4")])
    samples, _ = collector(fake).collect()
    assert value(samples, "nvml_gpu_info", gpu_uuid=UUID0, name="Tesla T4") == 1.0


def test_configured_labels_are_added_but_never_override_the_collectors_own() -> None:
    fake = FakePynvml([h100(UUID0)])
    samples, _ = collector(fake, labels={"rack": "r12", "gpu_uuid": "bogus"}).collect()
    assert all(label_value(s.labels, "rack") == "r12" for s in samples)
    assert all(label_value(s.labels, "gpu_uuid") == UUID0 for s in samples)


def test_without_pcie_the_20ms_sampling_call_is_never_made() -> None:
    fake = FakePynvml([h100(UUID0)])
    samples, _ = collector(fake, pcie=False).collect()
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert not by_name(samples, "nvml_gpu_pcie_tx_bytes_per_second")


@pytest.mark.parametrize(("mask", "names"), [
    (0, []),
    (0x1, ["gpu_idle"]),
    (0x4 | 0x40, ["sw_power_cap", "hw_thermal_slowdown"]),
    (0x8 | 0x20 | 0x80, ["hw_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"]),
    (0x2 | 0x10 | 0x100, ["applications_clocks_setting", "sync_boost", "display_clock_setting"]),
    (0x4 | 0x400 | 0x10000, ["sw_power_cap", "unknown_0x400", "unknown_0x10000"]),
], ids=["none", "idle", "power-and-thermal", "hardware", "settings", "unknown-bits-named"])
def test_clock_event_reasons_bitmask_is_decoded_to_names(mask: int, names: list[str]) -> None:
    assert decode_clock_reasons(mask) == names


def test_reason_bits_match_pynvml() -> None:
    for bit, name in CLOCK_EVENT_REASONS:
        camel = "".join(part.capitalize() for part in name.split("_"))
        const = getattr(pynvml, f"nvmlClocksEventReason{camel}", None)
        assert const == bit, name


def test_older_pynvml_without_clocks_event_reasons_uses_throttle_reasons() -> None:
    fake = FakePynvml([h100(UUID0, reasons=0x40)])
    fake.nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment,method-assign]
    samples, _ = collector(fake).collect()
    assert value(samples, "nvml_gpu_clocks_event_active", reason="hw_thermal_slowdown") == 1.0
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1


def test_driver_without_clocks_event_reasons_falls_back_and_does_not_ask_again() -> None:
    fake = FakePynvml([h100(UUID0, reasons=0x20)])
    missing = nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def event_reasons(_handle: Handle) -> int:
        fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] += 1
        raise missing

    fake.nvmlDeviceGetCurrentClocksEventReasons = event_reasons  # type: ignore[assignment,method-assign]
    c = collector(fake)
    for _ in range(3):
        samples, health = c.collect()
        assert value(samples, "nvml_gpu_clocks_event_reasons") == 0x20
        assert health.error is None
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3


# --- per-function failures ---------------------------------------------------------------------


def test_not_supported_readings_are_skipped_silently_and_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A GeForce-like board: no ECC, no energy, no PCIe counters, no clock reasons.
    ns = not_supported
    fake = FakePynvml([h100(UUID0, ecc=ns(), energy=ns(), pcie=ns(), reasons=ns(),
                            power_limit=ns(), processes=ns(), name=ns())])
    c = collector(fake)
    with caplog.at_level(logging.DEBUG, logger="tritonwatch.collector.nvml"):
        for _ in range(3):
            samples, health = c.collect()
            assert health.up and health.error is None
    names = {s.name for s in samples}
    for absent in ("nvml_gpu_ecc_errors", "nvml_gpu_energy_joules",
                   "nvml_gpu_pcie_tx_bytes_per_second", "nvml_gpu_clocks_event_reasons",
                   "nvml_gpu_power_limit_watts", "nvml_gpu_compute_processes", "nvml_gpu_info"):
        assert absent not in names
    assert "nvml_gpu_utilization_ratio" in names and "nvml_gpu_power_watts" in names
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 4  # once per (type, counter)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 2
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetMigMode"] == 1
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 3
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_unsupported_is_remembered_per_gpu() -> None:
    fake = FakePynvml([h100(UUID0, temperature=not_supported()), h100(UUID1)])
    c = collector(fake)
    c.collect()
    samples, _ = c.collect()
    assert not by_name(samples, "nvml_gpu_temperature_celsius", gpu_uuid=UUID0)
    assert value(samples, "nvml_gpu_temperature_celsius", gpu_uuid=UUID1) == 61
    assert fake.calls["nvmlDeviceGetTemperature"] == 3


def test_other_errors_skip_the_reading_are_logged_once_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakePynvml([h100(UUID0, processes=nvml_error(pynvml.NVML_ERROR_NO_PERMISSION))])
    c = collector(fake)
    with caplog.at_level(logging.WARNING, logger="tritonwatch.collector.nvml"):
        for _ in range(4):
            samples, health = c.collect()
    assert health.up and not by_name(samples, "nvml_gpu_compute_processes")
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 4
    warnings = [r for r in caplog.records if "processes" in r.getMessage()]
    assert len(warnings) == 1


def test_a_lost_gpu_is_named_in_health_and_the_others_continue() -> None:
    lost = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert isinstance(lost, pynvml.NVMLError_GpuIsLost)
    fake = FakePynvml([h100(UUID0), h100(UUID1, temperature=lost)])
    samples, health = collector(fake).collect()
    assert health.up  # NVML answered, one GPU is still readable
    assert health.error == f"GPU 1 ({UUID1}) is lost"
    assert value(samples, "nvml_gpu_up", gpu_uuid=UUID1, index="1") == 0.0
    assert [s.name for s in samples if label_value(s.labels, "gpu_uuid") == UUID1] == [
        "nvml_gpu_up"]  # readings taken before the loss are dropped, not half-reported
    assert value(samples, "nvml_gpu_up", gpu_uuid=UUID0) == 1.0
    assert value(samples, "nvml_gpu_temperature_celsius", gpu_uuid=UUID0) == 61


def test_a_gpu_lost_at_handle_lookup_keeps_its_last_known_uuid() -> None:
    fake = FakePynvml([h100(UUID0), h100(UUID1)])
    c = collector(fake)
    c.collect()
    fake.gpus[1]["handle_error"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    samples, health = c.collect()
    assert health.error == f"GPU 1 ({UUID1}) is lost"
    assert value(samples, "nvml_gpu_up", gpu_uuid=UUID1) == 0.0
    fresh = FakePynvml([h100(UUID0, handle_error=nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST))])
    samples, health = collector(fresh).collect()
    assert not health.up and health.error == "GPU 0 is lost" and samples == []


def test_every_gpu_lost_means_down() -> None:
    lost = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    fake = FakePynvml([h100(UUID0, utilization=lost), h100(UUID1, memory=lost)])
    samples, health = collector(fake).collect()
    assert not health.up
    assert health.error == f"GPU 0 ({UUID0}) is lost; GPU 1 ({UUID1}) is lost"
    assert {s.value for s in samples} == {0.0}


def test_host_with_nvml_but_no_gpus_is_up_and_empty() -> None:
    samples, health = collector(FakePynvml([])).collect()
    assert health.up and samples == [] and health.error is None


# --- NVML unavailable ----------------------------------------------------------------------------


def test_no_nvml_library_is_one_stable_health_entry_logged_once_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing = [nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) for _ in range(100)]
    fake = FakePynvml([h100(UUID0)], init_errors=missing)
    clock = Clock(0.0)
    c = collector(fake, clock, retry_min_s=30, retry_max_s=300)
    attempts: list[float] = []
    errors = set()
    with caplog.at_level(logging.DEBUG, logger="tritonwatch.collector.nvml"):
        while clock.now <= 3600:  # an hour of 15 s reads
            before = fake.calls["nvmlInit"]
            samples, health = c.collect()
            if fake.calls["nvmlInit"] > before:
                attempts.append(clock.now)
            assert samples == [] and not health.up and health.samples == 0
            errors.add(health.error)
            clock.now += 15
    assert errors == {"NVML unavailable: NVML Shared Library Not Found"}
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[:4] == [30, 60, 120, 240]  # doubling (rounded up to the 15 s schedule)
    assert all(g == 300 for g in gaps[4:]) and len(attempts) <= 16
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "NVML unavailable on gpu-node-7: NVML Shared Library Not Found" in (
        warnings[0].getMessage())
    assert fake.calls["nvmlDeviceGetCount"] == 0


def test_nvml_that_appears_later_is_picked_up_and_the_backoff_resets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakePynvml([h100(UUID0)],
                      init_errors=[nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)] * 2)
    clock = Clock(0.0)
    c = collector(fake, clock, retry_min_s=30, retry_max_s=300)
    _, health = c.collect()
    assert health.error == "NVML unavailable: Driver Not Loaded"
    clock.now = 10
    c.collect()
    assert fake.calls["nvmlInit"] == 1  # within the back-off: not asked
    clock.now = 30
    c.collect()
    clock.now = 90
    with caplog.at_level(logging.WARNING, logger="tritonwatch.collector.nvml"):
        samples, health = c.collect()
    assert health.up and samples and c.available
    assert any("available again" in r.getMessage() for r in caplog.records)
    assert fake.calls["nvmlInit"] == 3


def test_driver_gone_mid_run_shuts_down_and_retries_with_backoff() -> None:
    fake = FakePynvml([h100(UUID0)])
    clock = Clock(0.0)
    c = collector(fake, clock, retry_min_s=30)
    assert c.collect()[1].up
    fake.count = nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
    clock.now = 15
    samples, health = c.collect()
    assert samples == [] and not health.up
    assert health.error == "NVML unavailable: Uninitialized"
    assert fake.calls["nvmlShutdown"] == 1 and fake.calls["nvmlEventSetFree"] == 1
    fake.count = None
    clock.now = 30
    assert not c.collect()[1].up  # still backing off
    clock.now = 45
    assert c.collect()[1].up
    assert fake.calls["nvmlInit"] == 2


def test_pynvml_not_installed_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    samples, health = NvmlCollector("h", clock=Clock(T0)).collect()
    assert samples == [] and not health.up
    assert health.error is not None
    assert health.error.startswith("NVML unavailable: pynvml is not installed")


def test_real_pynvml_on_this_machine_reports_nvml_unavailable_once() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # a GPU machine: tests/gpu/ covers it
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here")
    clock = Clock(0.0)
    c = NvmlCollector("this-host", clock=clock)  # the real pynvml module
    results = []
    for t in (0.0, 15.0, 30.0):
        clock.now = t
        results.append(c.collect())
    for samples, health in results:
        assert samples == [] and not health.up and health.source == "nvml"
        assert health.error is not None and health.error.startswith("NVML unavailable: ")
    assert len({h.error for _, h in results}) == 1
    assert not c.available
    c.close()


# --- MIG, events, lifecycle --------------------------------------------------------------------


def test_mig_instances_are_reported_under_their_own_names() -> None:
    mig_a: dict[str, Any] = {"uuid": "MIG-aaaaaaaa-1111-2222-3333-444444444444",
             "memory": SimpleNamespace(total=10 * GIB, free=9 * GIB, used=1 * GIB),
             "utilization": not_supported(),
             "processes": [SimpleNamespace(pid=1)]}
    mig_b: dict[str, Any] = {"uuid": "MIG-bbbbbbbb-1111-2222-3333-444444444444",
             "memory": SimpleNamespace(total=20 * GIB, free=15 * GIB, used=5 * GIB),
             "utilization": SimpleNamespace(gpu=40, memory=0),
             "processes": []}
    fake = FakePynvml([h100(UUID0, mig_mode=[pynvml.NVML_DEVICE_MIG_ENABLE, 1],
                            utilization=not_supported())],
                      mig={0: [mig_a, None, mig_b, None]})
    c = collector(fake)
    c.collect()
    samples, health = c.collect()
    assert health.up
    assert value(samples, "nvml_gpu_mig_mode", gpu_uuid=UUID0) == 1.0
    a = {"mig_uuid": mig_a["uuid"], "mig_index": "0", "gpu_uuid": UUID0, "index": "0"}
    b = {"mig_uuid": mig_b["uuid"], "mig_index": "2"}
    assert value(samples, "nvml_mig_memory_used_bytes", **a) == 1 * GIB
    assert value(samples, "nvml_mig_memory_total_bytes", **b) == 20 * GIB
    assert value(samples, "nvml_mig_compute_processes", **a) == 1
    assert value(samples, "nvml_mig_compute_processes", **b) == 0
    assert value(samples, "nvml_mig_utilization_ratio", **b) == pytest.approx(0.4)
    assert not by_name(samples, "nvml_mig_utilization_ratio", **a)
    assert not by_name(samples, "nvml_gpu_memory_used_bytes", mig_uuid=mig_a["uuid"])


def test_mig_disabled_gpu_reports_mode_zero_and_no_instances() -> None:
    fake = FakePynvml([h100(UUID0, mig_mode=[0, 0])])
    samples, _ = collector(fake).collect()
    assert value(samples, "nvml_gpu_mig_mode") == 0.0
    assert fake.calls["nvmlDeviceGetMaxMigDeviceCount"] == 0


def test_xid_events_are_drained_without_waiting_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakePynvml([h100(UUID0), h100(UUID1)])
    c = collector(fake)
    samples, _ = c.collect()  # registers both GPUs
    assert fake.calls["nvmlDeviceRegisterEvents"] == 2
    xid = pynvml.nvmlEventTypeXidCriticalError
    fake.events.extend([
        SimpleNamespace(device=Handle(1), eventType=xid, eventData=79),
        SimpleNamespace(device=Handle(1), eventType=xid, eventData=48),
        SimpleNamespace(device=Handle(1), eventType=xid, eventData=48),
        SimpleNamespace(device=Handle(0), eventType=0x1, eventData=0),  # not an XID
    ])
    with caplog.at_level(logging.WARNING, logger="tritonwatch.collector.nvml"):
        samples, _ = c.collect()
        samples2, _ = c.collect()
    assert value(samples, "nvml_gpu_xid_errors", gpu_uuid=UUID1) == 3
    assert value(samples, "nvml_gpu_last_xid", gpu_uuid=UUID1) == 48
    assert value(samples, "nvml_gpu_xid_errors", gpu_uuid=UUID0) == 0
    assert value(samples2, "nvml_gpu_xid_errors", gpu_uuid=UUID1) == 3  # a counter
    assert set(fake.wait_timeouts) == {0}
    assert fake.calls["nvmlDeviceRegisterEvents"] == 2  # registered once per GPU
    xid_logs = [r.getMessage() for r in caplog.records if "XID" in r.getMessage()]
    assert len(xid_logs) == 2  # once per (GPU, XID)


def test_an_xid_storm_is_drained_in_bounded_steps() -> None:
    fake = FakePynvml([h100(UUID0)])
    c = collector(fake)
    c.collect()
    xid = pynvml.nvmlEventTypeXidCriticalError
    fake.events.extend(SimpleNamespace(device=Handle(0), eventType=xid, eventData=13)
                       for _ in range(nvml_mod.MAX_EVENTS_PER_READ + 10))
    samples, _ = c.collect()
    assert value(samples, "nvml_gpu_xid_errors") == nvml_mod.MAX_EVENTS_PER_READ
    samples, _ = c.collect()
    assert value(samples, "nvml_gpu_xid_errors") == nvml_mod.MAX_EVENTS_PER_READ + 10


def test_gpu_without_event_support_gets_no_xid_series_and_is_not_asked_again() -> None:
    fake = FakePynvml([h100(UUID0, register_events=not_supported())])
    c = collector(fake)
    for _ in range(3):
        samples, health = c.collect()
    assert health.error is None and not by_name(samples, "nvml_gpu_xid_errors")
    assert fake.calls["nvmlDeviceRegisterEvents"] == 1
    assert fake.calls["nvmlEventSetWait"] == 0


def test_xid_events_can_be_switched_off() -> None:
    fake = FakePynvml([h100(UUID0)])
    samples, _ = collector(fake, xid_events=False).collect()
    assert fake.calls["nvmlEventSetCreate"] == 0 and not by_name(samples, "nvml_gpu_xid_errors")


def test_close_frees_the_event_set_and_shuts_nvml_down_once() -> None:
    fake = FakePynvml([h100(UUID0)])
    c = collector(fake)
    c.collect()
    c.close()
    c.close()
    assert fake.calls["nvmlEventSetFree"] == 1 and fake.calls["nvmlShutdown"] == 1
    assert not c.available


def test_every_nvml_function_the_collector_calls_is_exercised() -> None:
    source = Path(nvml_mod.__file__).read_text()
    used = set(re.findall(r"\b(nvml[A-Z]\w+)", source)) - {"nvmlEventTypeXidCriticalError"}
    calls: Counter[str] = Counter()
    # A full GPU with MIG and an XID, then an older driver's throttle-reasons name.
    fake = FakePynvml([h100(UUID0, mig_mode=[1, 1])],
                      mig={0: [{"uuid": "MIG-x", "memory": SimpleNamespace(total=1, used=0),
                                "utilization": not_supported(), "processes": []}, None]})
    c = collector(fake)
    c.collect()
    fake.events.append(SimpleNamespace(device=Handle(0), eventType=0x8, eventData=31))
    c.collect()
    c.close()
    calls.update(fake.calls)
    older = FakePynvml([h100(UUID0)])
    older.nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment,method-assign]
    collector(older).collect()
    calls.update(older.calls)
    assert used, "no NVML function names found in collector/nvml.py"
    assert used <= set(calls), sorted(used - set(calls))
    for name in used:  # the fake really implements the real API
        assert hasattr(pynvml, name), name


# --- configuration -----------------------------------------------------------------------------


def test_config_defaults_durations_and_from_config() -> None:
    cfg = NvmlConfig.model_validate({"interval": "30s", "host": "gpu-node-7",
                                     "init_retry_max": "10m", "labels": {"rack": "r1"},
                                     "pcie": False})
    assert cfg.enabled and cfg.interval == 30.0 and cfg.init_retry_min == 30.0
    assert cfg.init_retry_max == 600.0 and cfg.idle_utilization_below == 0.1
    c = NvmlCollector.from_config(cfg, clock=Clock(T0), nvml_module=FakePynvml([h100(UUID0)]))
    samples, health = c.collect()
    assert health.target == "gpu-node-7" and c.retry_max_s == 600.0 and not c.pcie
    assert all(label_value(s.labels, "rack") == "r1" for s in samples)
    assert NvmlConfig().host  # defaults to the hostname


@pytest.mark.parametrize("bad", [
    {"interval": "0s"}, {"interval": "soon"}, {"init_retry_min": "10m", "init_retry_max": "5m"},
    {"idle_utilization_below": 0}, {"idle_utilization_below": 1.5}, {"host": ""},
    {"unknown_key": 1},
])
def test_config_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        NvmlConfig.model_validate(bad)


def test_config_is_frozen() -> None:
    cfg = NvmlConfig(host="h")
    with pytest.raises(pydantic.ValidationError):
        cfg.interval = 1.0  # type: ignore[misc]
