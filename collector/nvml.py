"""GPU telemetry straight from the driver (NVML, via nvidia-ml-py's ``pynvml``).

Triton's own ``nv_gpu_*`` come from DCGM and carry utilization, memory and power only; a GPU
that throttles, runs hot, or logs ECC or XID errors is invisible there.  ``NvmlCollector`` reads
the rest, per GPU, labelled ``gpu_uuid`` (NVML's ``GPU-...`` UUID, the same value Triton puts in
its ``gpu_uuid`` label) and ``index`` (NVML's device index), plus ``mig_uuid``/``mig_index`` for
MIG instances.

Series (units in the name, Prometheus style; counters are stored without ``_total``):

==============================================  =======  =====================================
series                                          unit     meaning
==============================================  =======  =====================================
``nvml_gpu_up``                                 0/1      1 if the GPU answered, 0 if it is lost
``nvml_gpu_info`` {name}                        1        product name as a label
``nvml_gpu_utilization_ratio``                  ratio    time a kernel ran, 0-1 (NVML %/100)
``nvml_gpu_memory_utilization_ratio``           ratio    time device memory was read/written
``nvml_gpu_memory_used_bytes`` / ``_total_``    bytes    framebuffer memory used / total
``nvml_gpu_power_watts``                        W        power draw
``nvml_gpu_power_limit_watts``                  W        enforced power limit
``nvml_gpu_energy_joules``                      J        counter, energy since driver load
``nvml_gpu_temperature_celsius``                °C       GPU core temperature
``nvml_gpu_sm_clock_hertz``                     Hz       current SM clock
``nvml_gpu_memory_clock_hertz``                 Hz       current memory clock
``nvml_gpu_clocks_event_reasons``               bitmask  raw clock event (throttle) reasons
``nvml_gpu_clocks_event_active`` {reason}       0/1      one series per known reason
``nvml_gpu_ecc_errors`` {error_type, counter}   errors   corrected/uncorrected x
                                                         volatile/aggregate
``nvml_gpu_pcie_tx_bytes_per_second`` / rx      B/s      PCIe throughput (NVML KB/s x 1024)
``nvml_gpu_compute_processes``                  procs    running compute processes
``nvml_gpu_xid_errors``                         events   counter of XID critical errors seen
                                                         by this collector since it started
``nvml_gpu_last_xid``                           code     last XID seen (0: none)
``nvml_gpu_mig_mode``                           0/1      current MIG mode
``nvml_mig_memory_used_bytes`` / ``_total_``    bytes    per MIG instance
``nvml_mig_utilization_ratio``                  ratio    per MIG instance, where NVML has it
``nvml_mig_compute_processes``                  procs    per MIG instance
==============================================  =======  =====================================

MIG instances get their own ``nvml_mig_*`` names so that summing ``nvml_gpu_*`` by GPU never
counts a MIG slice's memory twice.

Failure handling:

* ``NVMLError_NotSupported`` (or ``FunctionNotFound``, an older driver) from one function on one
  device skips that reading silently and is remembered, so it is not retried every read.
* ``NVMLError_GpuIsLost`` on a device drops that device's readings of this pass, emits
  ``nvml_gpu_up 0`` for it and names it in the health error; the other GPUs continue.
* Any other error of a function is logged once (per device, function and error) and the
  reading is skipped for this pass.
* No NVML at all (no library, no driver, pynvml missing) yields one health entry
  ``NVML unavailable: <reason>`` with a stable text, a single warning in the log, and an
  exponential back-off on re-initialisation (``retry_min_s`` doubling to ``retry_max_s``).

``collect()`` blocks (PCIe throughput alone samples ~20 ms per direction per GPU): run it in a
worker thread, on its own schedule, one call at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tritonwatch.schemas.nvml import NvmlConfig
from tritonwatch.schemas.samples import Labels, Sample, TargetHealth, make_labels

log = logging.getLogger(__name__)

Clock = Callable[[], float]

#: ``TargetHealth.source`` of the NVML collector.
SOURCE = "nvml"

#: Clock event (formerly "throttle") reason bits, as NVML defines them, and their names.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

#: Reasons that cost performance (clocks held below what the workload asks for).  Idle, the
#: application-clock setting, sync boost and the display clock are not throttling.
THROTTLE_REASONS = frozenset({
    "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
})

# NVML ABI constants (stable across driver versions; pynvml defines the same values).
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
_CLOCK_SM = 1  # NVML_CLOCK_SM
_CLOCK_MEM = 2  # NVML_CLOCK_MEM
_PCIE_TX = 0  # NVML_PCIE_UTIL_TX_BYTES
_PCIE_RX = 1  # NVML_PCIE_UTIL_RX_BYTES
_ECC_TYPES = (("corrected", 0), ("uncorrected", 1))  # NVML_MEMORY_ERROR_TYPE_*
_ECC_COUNTERS = (("volatile", 0), ("aggregate", 1))  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
_EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError

#: Events drained per read at most, so an XID storm cannot stall the collector.
MAX_EVENTS_PER_READ = 256


def decode_clock_reasons(mask: int) -> list[str]:
    """Names of the reason bits set in ``mask``; unknown bits appear as ``unknown_0x...``."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _GpuLost(Exception):
    pass


class _Skip:
    """Marker: the reading is unavailable this pass."""


_SKIP = _Skip()


class NvmlCollector:
    """Reads every GPU (and MIG instance) of this machine through NVML.

    ``nvml_module`` is the ``pynvml`` module (imported on first use when ``None``); tests pass
    a stand-in.  ``clock`` stamps samples and health and drives the re-initialisation back-off.
    """

    def __init__(
        self,
        host: str,
        *,
        clock: Clock = time.time,
        nvml_module: Any = None,
        labels: Mapping[str, str] | None = None,
        retry_min_s: float = 30.0,
        retry_max_s: float = 300.0,
        pcie: bool = True,
        xid_events: bool = True,
        mig: bool = True,
    ) -> None:
        self.host = host
        self.clock = clock
        self.extra_labels = dict(labels or {})
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self.pcie = pcie
        self.xid_events = xid_events
        self.mig = mig
        self._nv: Any = nvml_module
        self._lock = threading.Lock()
        self._initialized = False
        self._next_init_at = 0.0
        self._backoff = retry_min_s
        self._reason: str | None = None
        self._warned_unavailable = False
        self._unsupported: set[tuple[str, str]] = set()
        self._logged: set[tuple[str, str, str]] = set()
        self._event_set: Any = None
        self._xid_registered: set[str] = set()
        self._xid_count: dict[str, int] = {}
        self._last_xid: dict[str, int] = {}
        self._xid_logged: set[tuple[str, int]] = set()
        self._uuid_by_index: dict[int, str] = {}

    @classmethod
    def from_config(
        cls, config: NvmlConfig, *, clock: Clock = time.time, nvml_module: Any = None
    ) -> NvmlCollector:
        return cls(
            config.host, clock=clock, nvml_module=nvml_module, labels=config.labels,
            retry_min_s=config.init_retry_min, retry_max_s=config.init_retry_max,
            pcie=config.pcie, xid_events=config.xid_events, mig=config.mig,
        )

    # --- public -------------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """Whether NVML is initialised right now."""
        return self._initialized

    def collect(self) -> tuple[list[Sample], TargetHealth]:
        """One read of every GPU: samples and the ``nvml`` health entry of this host."""
        with self._lock:
            now = self.clock()
            start = time.perf_counter()
            if not self._initialized and not self._try_init(now):
                return [], self._unavailable(now, start)
            nv = self._nv
            try:
                count = int(nv.nvmlDeviceGetCount())
            except nv.NVMLError as exc:
                # The library answered init but not this: the driver went away (unloaded,
                # version mismatch after an upgrade).  Start over with the back-off.
                self._teardown()
                self._fail(now, _text(exc))
                return [], self._unavailable(now, start)
            samples: list[Sample] = []
            lost: list[str] = []
            self._drain_events()
            for index in range(count):
                problem = self._read_device(index, samples)
                if problem is not None:
                    lost.append(problem)
            up = count == 0 or len(lost) < count
            health = TargetHealth(
                self.host, SOURCE, now, up, time.perf_counter() - start, len(samples),
                "; ".join(lost) or None,
            )
            return samples, health

    def close(self) -> None:
        """Free the event set and shut NVML down (safe to call more than once)."""
        with self._lock:
            self._teardown()

    # --- initialisation and back-off ------------------------------------------------------------

    def _try_init(self, now: float) -> bool:
        if now < self._next_init_at:
            return False
        if self._nv is None:
            try:
                import pynvml
            except ImportError as exc:
                self._fail(now, f"pynvml is not installed ({exc})")
                return False
            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            self._fail(now, _text(exc))
            return False
        except OSError as exc:  # a broken library file rather than a missing one
            self._fail(now, f"cannot load NVML: {exc}")
            return False
        if self._reason is not None:
            log.warning("NVML on %s is available again", self.host)
        self._initialized = True
        self._reason = None
        self._backoff = self.retry_min_s
        self._next_init_at = 0.0
        if self.xid_events:
            try:
                self._event_set = nv.nvmlEventSetCreate()
            except nv.NVMLError as exc:
                self._log_once("host", "nvmlEventSetCreate", exc)
                self._event_set = None
        return True

    def _fail(self, now: float, reason: str) -> None:
        self._reason = reason
        self._next_init_at = now + self._backoff
        if not self._warned_unavailable:
            self._warned_unavailable = True
            log.warning(
                "NVML unavailable on %s: %s; NVML GPU telemetry is off (Triton's nv_gpu_* still "
                "flow), initialisation is retried at most every %.0f s",
                self.host, reason, self.retry_max_s,
            )
        else:
            log.debug("NVML still unavailable on %s: %s; next try in %.0f s",
                      self.host, reason, self._backoff)
        self._backoff = min(self._backoff * 2, self.retry_max_s)

    def _unavailable(self, now: float, start: float) -> TargetHealth:
        return TargetHealth(self.host, SOURCE, now, False, time.perf_counter() - start, 0,
                            f"NVML unavailable: {self._reason}")

    def _teardown(self) -> None:
        if not self._initialized:
            return
        nv = self._nv
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError as exc:
                log.debug("nvmlEventSetFree failed: %s", exc)
            self._event_set = None
        self._xid_registered.clear()
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)
        self._initialized = False

    # --- calling NVML -------------------------------------------------------------------------

    def _log_once(self, device: str, what: str, exc: BaseException) -> None:
        key = (device, what, type(exc).__name__)
        if key in self._logged:
            log.debug("NVML %s on %s failed: %s", what, device, exc)
            return
        self._logged.add(key)
        log.warning("NVML %s on %s failed: %s (logged once)", what, device, exc)

    def _unsupported_errors(self) -> tuple[type[BaseException], ...]:
        nv = self._nv
        found = (getattr(nv, "NVMLError_NotSupported", None),
                 getattr(nv, "NVMLError_FunctionNotFound", None))
        return tuple(cls for cls in found if cls is not None)

    def _call(self, device: str, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or ``_SKIP`` when unsupported (remembered) or failing (logged once)."""
        if (device, key) in self._unsupported:
            return _SKIP
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError_GpuIsLost:
            raise _GpuLost() from None
        except self._unsupported_errors():
            self._unsupported.add((device, key))
            log.debug("NVML %s is not supported on %s; not asked again", key, device)
            return _SKIP
        except nv.NVMLError as exc:
            self._log_once(device, key, exc)
            return _SKIP

    # --- one device ---------------------------------------------------------------------------

    def _labels(self, **own: str) -> Labels:
        merged = dict(self.extra_labels)
        merged.update(own)
        return make_labels(merged)

    def _read_device(self, index: int, out: list[Sample]) -> str | None:
        """Append one GPU's samples to ``out``; return a health problem, or None."""
        nv = self._nv
        dev = f"GPU {index}"
        uuid = ""
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
        except nv.NVMLError_GpuIsLost:
            known = self._uuid_by_index.get(index)
            if known is None:
                return f"{dev} is lost"
            out.append(Sample("nvml_gpu_up", self._labels(gpu_uuid=known, index=str(index)), 0.0))
            return f"{dev} ({known}) is lost"
        except nv.NVMLError as exc:
            self._log_once(dev, "nvmlDeviceGetHandleByIndex/GetUUID", exc)
            return f"{dev} unreadable: {_text(exc)}"
        self._uuid_by_index[index] = uuid
        labels = self._labels(gpu_uuid=uuid, index=str(index))
        mine: list[Sample] = []
        try:
            self._read_gpu(uuid, handle, labels, mine)
        except _GpuLost:
            out.append(Sample("nvml_gpu_up", labels, 0.0))
            return f"{dev} ({uuid}) is lost"
        out.append(Sample("nvml_gpu_up", labels, 1.0))
        out.extend(mine)
        return None

    def _read_gpu(self, uuid: str, handle: Any, labels: Labels, out: list[Sample]) -> None:
        nv = self._nv
        call = self._call

        def emit(name: str, value: float, extra: Labels = ()) -> None:
            out.append(Sample(name, make_labels(labels + extra) if extra else labels, value))

        name = call(uuid, "name", nv.nvmlDeviceGetName, handle)
        if name is not _SKIP:
            emit("nvml_gpu_info", 1.0, (("name", _text(name)),))
        util = call(uuid, "utilization", nv.nvmlDeviceGetUtilizationRates, handle)
        if util is not _SKIP:
            emit("nvml_gpu_utilization_ratio", float(util.gpu) / 100.0)
            emit("nvml_gpu_memory_utilization_ratio", float(util.memory) / 100.0)
        mem = call(uuid, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
        if mem is not _SKIP:
            emit("nvml_gpu_memory_used_bytes", float(mem.used))
            emit("nvml_gpu_memory_total_bytes", float(mem.total))
        for key, fn, series, scale in (
            ("power", nv.nvmlDeviceGetPowerUsage, "nvml_gpu_power_watts", 0.001),
            ("power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, "nvml_gpu_power_limit_watts",
             0.001),
            ("energy", nv.nvmlDeviceGetTotalEnergyConsumption, "nvml_gpu_energy_joules", 0.001),
        ):
            value = call(uuid, key, fn, handle)
            if value is not _SKIP:
                emit(series, float(value) * scale)
        temp = call(uuid, "temperature", nv.nvmlDeviceGetTemperature, handle, _TEMPERATURE_GPU)
        if temp is not _SKIP:
            emit("nvml_gpu_temperature_celsius", float(temp))
        for key, clock, series in (("sm_clock", _CLOCK_SM, "nvml_gpu_sm_clock_hertz"),
                                   ("mem_clock", _CLOCK_MEM, "nvml_gpu_memory_clock_hertz")):
            mhz = call(uuid, key, nv.nvmlDeviceGetClockInfo, handle, clock)
            if mhz is not _SKIP:
                emit(series, float(mhz) * 1e6)
        mask = self._clock_reasons(uuid, handle)
        if mask is not None:
            emit("nvml_gpu_clocks_event_reasons", float(mask))
            for bit, reason in CLOCK_EVENT_REASONS:
                emit("nvml_gpu_clocks_event_active", 1.0 if mask & bit else 0.0,
                     (("reason", reason),))
        for etype, etype_id in _ECC_TYPES:
            for counter, counter_id in _ECC_COUNTERS:
                errors = call(uuid, f"ecc_{etype}_{counter}", nv.nvmlDeviceGetTotalEccErrors,
                              handle, etype_id, counter_id)
                if errors is not _SKIP:
                    emit("nvml_gpu_ecc_errors", float(errors),
                         (("counter", counter), ("error_type", etype)))
        if self.pcie:
            for key, counter_id in (("tx", _PCIE_TX), ("rx", _PCIE_RX)):
                kbs = call(uuid, f"pcie_{key}", nv.nvmlDeviceGetPcieThroughput, handle,
                           counter_id)
                if kbs is not _SKIP:
                    emit(f"nvml_gpu_pcie_{key}_bytes_per_second", float(kbs) * 1024.0)
        procs = call(uuid, "processes", nv.nvmlDeviceGetComputeRunningProcesses, handle)
        if procs is not _SKIP:
            emit("nvml_gpu_compute_processes", float(len(procs)))
        if self._event_set is not None:
            self._register_xid(uuid, handle)
        if uuid in self._xid_registered:
            emit("nvml_gpu_xid_errors", float(self._xid_count.get(uuid, 0)))
            emit("nvml_gpu_last_xid", float(self._last_xid.get(uuid, 0)))
        if self.mig:
            self._read_mig(uuid, handle, labels, out)

    def _clock_reasons(self, uuid: str, handle: Any) -> int | None:
        """The reasons bitmask from the newest function this pynvml and driver offer."""
        nv = self._nv
        if (uuid, "clock_reasons") in self._unsupported:
            return None
        not_found = getattr(nv, "NVMLError_FunctionNotFound", ())
        for fn_name in ("nvmlDeviceGetCurrentClocksEventReasons",
                        "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, fn_name, None)
            if fn is None or (uuid, fn_name) in self._unsupported:
                continue
            try:
                return int(fn(handle))
            except nv.NVMLError_GpuIsLost:
                raise _GpuLost() from None
            except not_found:  # pynvml knows it, the driver does not: try the older name
                self._unsupported.add((uuid, fn_name))
                continue
            except nv.NVMLError_NotSupported:
                break
            except nv.NVMLError as exc:
                self._log_once(uuid, fn_name, exc)
                return None
        self._unsupported.add((uuid, "clock_reasons"))
        return None

    def _read_mig(self, uuid: str, handle: Any, labels: Labels, out: list[Sample]) -> None:
        nv = self._nv
        call = self._call
        mode = call(uuid, "mig_mode", nv.nvmlDeviceGetMigMode, handle)
        if mode is _SKIP:
            return
        current = int(mode[0])
        out.append(Sample("nvml_gpu_mig_mode", labels, 1.0 if current == _MIG_ENABLE else 0.0))
        if current != _MIG_ENABLE:
            return
        slots = call(uuid, "mig_count", nv.nvmlDeviceGetMaxMigDeviceCount, handle)
        if slots is _SKIP:
            return
        for slot in range(int(slots)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                mig_uuid = _text(nv.nvmlDeviceGetUUID(mig))
            except nv.NVMLError_GpuIsLost:
                raise _GpuLost() from None
            except nv.NVMLError_NotFound:
                continue  # empty slot
            except nv.NVMLError as exc:
                self._log_once(uuid, f"mig {slot}", exc)
                continue
            mig_labels = make_labels((*labels, ("mig_index", str(slot)), ("mig_uuid", mig_uuid)))
            mem = call(mig_uuid, "memory", nv.nvmlDeviceGetMemoryInfo, mig)
            if mem is not _SKIP:
                out.append(Sample("nvml_mig_memory_used_bytes", mig_labels, float(mem.used)))
                out.append(Sample("nvml_mig_memory_total_bytes", mig_labels, float(mem.total)))
            util = call(mig_uuid, "utilization", nv.nvmlDeviceGetUtilizationRates, mig)
            if util is not _SKIP:
                out.append(Sample("nvml_mig_utilization_ratio", mig_labels,
                                  float(util.gpu) / 100.0))
            procs = call(mig_uuid, "processes", nv.nvmlDeviceGetComputeRunningProcesses, mig)
            if procs is not _SKIP:
                out.append(Sample("nvml_mig_compute_processes", mig_labels, float(len(procs))))

    # --- XID events ---------------------------------------------------------------------------

    def _register_xid(self, uuid: str, handle: Any) -> None:
        if uuid in self._xid_registered:
            return
        nv = self._nv
        event = getattr(nv, "nvmlEventTypeXidCriticalError", _EVENT_XID)
        result = self._call(uuid, "xid_events", nv.nvmlDeviceRegisterEvents, handle, event,
                            self._event_set)
        if result is not _SKIP:
            self._xid_registered.add(uuid)

    def _drain_events(self) -> None:
        """Take every pending XID event without waiting (timeout 0)."""
        if self._event_set is None or not self._xid_registered:
            return
        nv = self._nv
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError_Timeout:
                return  # nothing pending
            except nv.NVMLError as exc:
                self._log_once("host", "nvmlEventSetWait", exc)
                return
            if not int(data.eventType) & _EVENT_XID:
                continue
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError as exc:
                self._log_once("host", "nvmlDeviceGetUUID(event)", exc)
                continue
            xid = int(data.eventData)
            self._xid_count[uuid] = self._xid_count.get(uuid, 0) + 1
            self._last_xid[uuid] = xid
            if (uuid, xid) not in self._xid_logged:
                self._xid_logged.add((uuid, xid))
                log.warning("XID %d on %s (%s): see NVIDIA's XID catalogue", xid, uuid,
                            self.host)
