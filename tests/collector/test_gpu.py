"""collector/gpu.py: the NVML x Triton join per GPU UUID, against hand-computed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonwatch.collector.derive import Deriver
from tritonwatch.collector.gpu import GPU_SLI_CATALOG, GpuSliDeriver, gpu_slis
from tritonwatch.collector.parse import parse
from tritonwatch.schemas.samples import Sample, Snapshot, label_value, make_labels

A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GIB = 1024.0**3


def s(name: str, value: float, **labels: str) -> Sample:
    return Sample(name, make_labels(labels), value)


def nvml_gpu(uuid: str, index: int, *, util: float = 0.5, used: float = 60 * GIB,
             total: float = 80 * GIB, power: float = 300.0, limit: float = 700.0,
             reasons: tuple[str, ...] = ()) -> list[Sample]:
    g = {"gpu_uuid": uuid, "index": str(index)}
    out = [s("nvml_gpu_up", 1, **g), s("nvml_gpu_utilization_ratio", util, **g),
           s("nvml_gpu_memory_used_bytes", used, **g), s("nvml_gpu_memory_total_bytes", total, **g),
           s("nvml_gpu_power_watts", power, **g), s("nvml_gpu_power_limit_watts", limit, **g)]
    for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                   "hw_thermal_slowdown", "hw_power_brake_slowdown", "sync_boost"):
        out.append(s("nvml_gpu_clocks_event_active", 1.0 if reason in reasons else 0.0,
                     reason=reason, **g))
    return out


def dcgm(uuid: str, *, util: float, used: float = 10 * GIB, total: float = 80 * GIB,
         power: float = 100.0, limit: float = 400.0) -> list[Sample]:
    return [s("nv_gpu_utilization", util, gpu_uuid=uuid),
            s("nv_gpu_memory_used_bytes", used, gpu_uuid=uuid),
            s("nv_gpu_memory_total_bytes", total, gpu_uuid=uuid),
            s("nv_gpu_power_usage", power, gpu_uuid=uuid),
            s("nv_gpu_power_limit", limit, gpu_uuid=uuid)]


def model(name: str, *, gpu: str | None = None, pending: float | None = None,
          queue_s: float | None = None) -> list[Sample]:
    m = {"model": name, "version": "1"}
    raw = {**m, "gpu_uuid": gpu} if gpu else m
    out = [s("nv_inference_request_success", 10, **raw)]
    if pending is not None:
        out.append(s("sli:pending_requests", pending, **m))
    if queue_s is not None:
        out.append(s("sli:queue_time_seconds", queue_s, **m))
    return out


def get(samples: list[Sample], name: str, /, **labels: str) -> float | None:
    found = [x.value for x in samples if x.name == name
             and all(label_value(x.labels, k) == v for k, v in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def test_headroom_and_throttling_from_nvml() -> None:
    out = gpu_slis(nvml_gpu(A, 0, util=0.9, reasons=("sw_power_cap", "gpu_idle")), {})
    assert get(out, "sli:gpu_utilization_ratio", gpu_uuid=A) == 0.9
    assert get(out, "sli:gpu_memory_headroom_bytes", gpu_uuid=A) == 20 * GIB
    assert get(out, "sli:gpu_memory_headroom_ratio", gpu_uuid=A) == pytest.approx(0.25)
    assert get(out, "sli:gpu_power_headroom_watts", gpu_uuid=A) == 400.0
    assert get(out, "sli:gpu_power_headroom_ratio", gpu_uuid=A) == pytest.approx(4 / 7)
    assert get(out, "sli:gpu_throttling", gpu_uuid=A) == 1.0
    assert get(out, "sli:gpu_throttle_reason", gpu_uuid=A, reason="sw_power_cap") == 1.0
    assert get(out, "sli:gpu_throttle_reason", gpu_uuid=A, reason="hw_slowdown") == 0.0
    # idle clocks and sync boost are not throttling
    assert get(out, "sli:gpu_throttle_reason", gpu_uuid=A, reason="gpu_idle") is None
    # no Triton knows this GPU: nothing about queues
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=A) is None


def test_idle_clocks_alone_are_not_throttling() -> None:
    out = gpu_slis(nvml_gpu(A, 0, reasons=("gpu_idle", "sync_boost")), {})
    assert get(out, "sli:gpu_throttling", gpu_uuid=A) == 0.0


def test_triton_dcgm_fills_in_without_nvml_and_no_throttling_is_claimed() -> None:
    out = gpu_slis([], {"triton-a": dcgm(A, util=0.3)})
    assert get(out, "sli:gpu_utilization_ratio", gpu_uuid=A) == 0.3
    assert get(out, "sli:gpu_memory_headroom_bytes", gpu_uuid=A) == 70 * GIB
    assert get(out, "sli:gpu_power_headroom_watts", gpu_uuid=A) == 300.0
    assert get(out, "sli:gpu_throttling", gpu_uuid=A) is None


def test_nvml_wins_over_dcgm_and_uuids_join_case_insensitively() -> None:
    out = gpu_slis(nvml_gpu(A, 0, util=0.8), {"t": dcgm(A.lower(), util=0.1)})
    assert get(out, "sli:gpu_utilization_ratio", gpu_uuid=A) == 0.8
    assert len([x for x in out if x.name == "sli:gpu_utilization_ratio"]) == 1


def test_dcgm_all_zero_is_unknown_not_idle() -> None:
    triton = {"t": dcgm(A, util=0, used=0, power=0) + model("m", gpu=A, pending=4)}
    out = gpu_slis([], triton)
    assert get(out, "sli:gpu_utilization_ratio", gpu_uuid=A) is None
    assert get(out, "sli:gpu_pending_requests", gpu_uuid=A) == 4
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=A) is None


def test_lost_gpu_in_nvml_falls_back_to_triton() -> None:
    lost = [s("nvml_gpu_up", 0, gpu_uuid=A, index="0")]
    out = gpu_slis(lost, {"t": dcgm(A, util=0.4)})
    assert get(out, "sli:gpu_utilization_ratio", gpu_uuid=A) == 0.4


def test_idle_while_requests_queue_on_the_gpu_the_model_runs_on() -> None:
    nvml = nvml_gpu(A, 0, util=0.02) + nvml_gpu(B, 1, util=0.03)
    triton = {"t": dcgm(A, util=0.02) + dcgm(B, util=0.03)
              + model("llm", gpu=A, pending=7) + model("embed", gpu=B, pending=0)}
    out = gpu_slis(nvml, triton)
    assert get(out, "sli:gpu_pending_requests", gpu_uuid=A) == 7
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=A) == 1.0
    assert get(out, "sli:gpu_pending_requests", gpu_uuid=B) == 0
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=B) == 0.0


def test_busy_gpu_with_a_queue_is_not_idle() -> None:
    out = gpu_slis(nvml_gpu(A, 0, util=0.95), {"t": model("llm", gpu=A, pending=30)})
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=A) == 0.0


def test_unknown_mapping_puts_every_model_of_the_server_on_every_gpu_of_it() -> None:
    triton = {"t": dcgm(A, util=0.01) + dcgm(B, util=0.9) + model("m", pending=2)
              + model("n", pending=1),
              "other": dcgm("GPU-cccccccc", util=0.01) + model("x", pending=50)}
    out = gpu_slis([], triton)
    assert get(out, "sli:gpu_pending_requests", gpu_uuid=A) == 3
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=A) == 1.0
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=B) == 0.0
    assert get(out, "sli:gpu_model_placement", gpu_uuid=B, model="n", triton_target="t") == 1


def test_models_without_gpu_uuid_on_a_mapped_server_are_not_on_a_gpu() -> None:
    triton = {"t": dcgm(A, util=0.01) + model("gpu_model", gpu=A, pending=0)
              + model("cpu_model", pending=9)}
    out = gpu_slis([], triton)
    assert get(out, "sli:gpu_pending_requests", gpu_uuid=A) == 0
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=A) == 0.0
    assert get(out, "sli:gpu_model_placement", model="cpu_model") is None


def test_per_gpu_pending_series_are_attributed_exactly() -> None:
    m = {"model": "llm", "version": "1"}
    triton = {"t": [s("nv_inference_pending_request_count", 5, gpu_uuid=A, **m),
                    s("nv_inference_pending_request_count", 0, gpu_uuid=B, **m),
                    s("sli:pending_requests", 5, **m),
                    *dcgm(A, util=0.5), *dcgm(B, util=0.01)]}
    out = gpu_slis([], triton)
    assert get(out, "sli:gpu_pending_requests", gpu_uuid=A) == 5
    assert get(out, "sli:gpu_pending_requests", gpu_uuid=B) == 0
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=B) == 0.0


def test_rising_queue_time_flags_an_idle_gpu_even_with_no_pending_gauge() -> None:
    deriver = GpuSliDeriver(idle_utilization_below=0.1, queue_time_rise_min_s=0.005)
    nvml = nvml_gpu(A, 0, util=0.05)
    first = deriver.derive(nvml, {"t": model("m", gpu=A, pending=0, queue_s=0.010)})
    assert get(first, "sli:gpu_queue_time_rising", gpu_uuid=A) == 0.0  # no baseline yet
    assert get(first, "sli:gpu_idle_while_queued", gpu_uuid=A) == 0.0
    small = deriver.derive(nvml, {"t": model("m", gpu=A, pending=0, queue_s=0.012)})
    assert get(small, "sli:gpu_queue_time_rising", gpu_uuid=A) == 0.0  # below the minimum
    risen = deriver.derive(nvml, {"t": model("m", gpu=A, pending=0, queue_s=0.050)})
    assert get(risen, "sli:gpu_queue_time_rising", gpu_uuid=A) == 1.0
    assert get(risen, "sli:gpu_idle_while_queued", gpu_uuid=A) == 1.0
    fell = deriver.derive(nvml, {"t": model("m", gpu=A, pending=0, queue_s=0.020)})
    assert get(fell, "sli:gpu_idle_while_queued", gpu_uuid=A) == 0.0


def test_mig_instance_joins_by_its_mig_uuid() -> None:
    mig = "MIG-11111111-2222-3333-4444-555555555555"
    g = {"gpu_uuid": A, "index": "0", "mig_uuid": mig, "mig_index": "0"}
    nvml = [s("nvml_gpu_up", 1, gpu_uuid=A, index="0"),
            s("nvml_mig_memory_used_bytes", 4 * GIB, **g),
            s("nvml_mig_memory_total_bytes", 10 * GIB, **g),
            s("nvml_mig_utilization_ratio", 0.0, **g)]
    out = gpu_slis(nvml, {"t": model("m", gpu=mig, pending=3)})
    assert get(out, "sli:gpu_memory_headroom_bytes", gpu_uuid=mig) == 6 * GIB
    assert get(out, "sli:gpu_idle_while_queued", gpu_uuid=mig) == 1.0
    assert get(out, "sli:gpu_memory_headroom_bytes", gpu_uuid=A) is None


def test_placement_carries_the_namespace_when_triton_has_one() -> None:
    triton = {"t": [s("nv_inference_request_success", 1, model="m", version="2",
                      namespace="team-a", gpu_uuid=A)]}
    out = gpu_slis([], triton)
    assert get(out, "sli:gpu_model_placement", gpu_uuid=A, model="m", version="2",
               namespace="team-a", triton_target="t") == 1.0


def test_every_emitted_sli_is_in_the_catalog_and_labels_are_canonical() -> None:
    deriver = GpuSliDeriver()
    nvml = nvml_gpu(A, 0, util=0.01, reasons=("hw_slowdown",))
    triton = {"t": dcgm(A, util=0.01) + model("m", gpu=A, pending=1, queue_s=0.1)}
    deriver.derive(nvml, triton)
    out = deriver.derive(nvml, triton)
    assert {x.name for x in out} == set(GPU_SLI_CATALOG)
    assert all(x.labels == tuple(sorted(x.labels)) for x in out)


def test_recorded_triton_payload_maps_its_models_onto_the_gpu() -> None:
    fixture = Path(__file__).parents[1] / "fixtures" / "parse" / "triton_22_legacy.prom"
    families = parse(fixture.read_text())
    snap = Snapshot("legacy", 1.0, tuple(families))
    raw = list(snap.samples())
    derived = Deriver("legacy").derive(snap, {})
    uuid = "GPU-6d4b5b1a-2f8c-2c3e-9e2b-1f1a6c0d7a11"
    out = gpu_slis(nvml_gpu(uuid, 0, util=0.5), {"legacy": raw + derived})
    placed = {label_value(x.labels, "model") for x in out
              if x.name == "sli:gpu_model_placement"}
    assert placed == {"densenet_onnx", "simple"}
    assert get(out, "sli:gpu_utilization_ratio", gpu_uuid=uuid) == 0.5
