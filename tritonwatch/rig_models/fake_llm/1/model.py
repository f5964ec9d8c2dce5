"""Fake streaming LLM for the Tritonwatch rig (runs inside Triton's Python backend stub).

Each request: sleep ``ttft_ms``, send the first token, then one response per token every
``itl_ms``, and finally an empty response flagged TRITONSERVER_RESPONSE_COMPLETE_FINAL. The model
is decoupled, so ``execute`` hands every request to its own thread and returns at once: streams
run concurrently on a single instance instead of queueing behind each other.

Behaviour is read on every request from the JSON control file named by $TRITONWATCH_RIG_CONTROL
(inherited from tritonserver), so tests can inject a slower first token, errors or a filling KV
cache into a live server. Keys and defaults: see ``DEFAULTS``.

When each response is sent is appended as JSONL to $TRITONWATCH_RIG_RESPONSE_LOG:
``{"request_id", "index", "t_ns", "final"}`` with ``t_ns`` from time.monotonic_ns(), i.e.
CLOCK_MONOTONIC, which is system-wide and so comparable with a client's clock on the same host.

The nv_trt_llm_* gauge families mimic the TensorRT-LLM backend (names, category labels, model and
version labels). Like the real backend they are refreshed by a poller (every 100 ms), but unlike
it the KV gauges follow the control file even when idle, so tests need no traffic to move them;
``freeze_metrics`` stops all updates to imitate the real backend's stale gauges when idle.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULTS: dict[str, object] = {
    "ttft_ms": 40.0,  # delay before the first token
    "itl_ms": 5.0,  # delay between tokens
    "tokens": 16,  # tokens per request unless the request sends max_tokens
    "fail": False,  # every request fails with an error response
    "fail_rate": 0.0,  # share of requests that fail (random)
    "fail_after_tokens": None,  # send N tokens, then an error instead of the rest
    "kv_used_fraction": 0.3,  # KV blocks used by "other" traffic, 0..1 of kv_max_blocks
    "kv_max_blocks": 1000,
    "kv_tokens_per_block": 64,
    "kv_reused_blocks": 0,
    "max_requests": 64,  # executor capacity; beyond it requests wait (active - scheduled)
    "paused_requests": 0,
    "freeze_metrics": False,  # stop refreshing the nv_trt_llm_* gauges
}

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


# The same class stands in the other rig model, on purpose: Triton's Python backend loads each
# model.py on its own (a stub process per model, nothing of ours on its path), and the model
# repository's root may hold only model directories, so there is no place for a module both
# could import.  tests/rig/test_rig.py keeps the two copies identical.
class _Control:
    """Reads the control file, re-parsing only when the file was replaced or changed."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._key: tuple[int, int] | None = None
        self._values: dict[str, object] = dict(DEFAULTS)
        self._lock = threading.Lock()

    def get(self) -> dict[str, object]:
        if not self._path:
            return dict(DEFAULTS)
        with self._lock:
            try:
                st = os.stat(self._path)
                key = (st.st_ino, st.st_mtime_ns)
                if key != self._key:
                    with open(self._path, encoding="utf-8") as f:
                        data = json.load(f)
                    values = dict(DEFAULTS)
                    values.update(data)
                    self._values, self._key = values, key
            except (OSError, ValueError):
                # A missing or half-written file must not break serving: keep the last values.
                pass
            return dict(self._values)


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        self.model_version = str(args["model_version"])
        self.control = _Control(os.environ.get("TRITONWATCH_RIG_CONTROL"))
        log_path = os.environ.get("TRITONWATCH_RIG_RESPONSE_LOG")
        self._log = open(log_path, "a", encoding="utf-8", buffering=1) if log_path else None
        self._log_lock = threading.Lock()
        self._state_lock = threading.Lock()
        # request key -> {"phase": "context"|"generation", "prompt_tokens": int, "tokens": int}
        self._inflight: dict[str, dict[str, int | str]] = {}
        self._iteration = 0
        self._stop = threading.Event()
        self._threads: set[threading.Thread] = set()
        self._init_metrics()
        self._poller = threading.Thread(target=self._poll_metrics, daemon=True)
        self._poller.start()

    # -- metrics ---------------------------------------------------------------------------

    def _init_metrics(self):
        labels = {"model": self.model_name, "version": self.model_version}

        def family(name, description, label, values):
            fam = pb_utils.MetricFamily(
                name=name, description=description, kind=pb_utils.MetricFamily.GAUGE
            )
            return fam, {v: fam.Metric(labels={**labels, label: v}) for v in values}

        self._families = []
        fam, self.m_kv = family(
            "nv_trt_llm_kv_cache_block_metrics",
            "TRT KV Cache block metrics",
            "kv_cache_block_type",
            ["max", "free", "used", "tokens_per", "fraction", "reused"],
        )
        self._families.append(fam)
        fam, self.m_req = family(
            "nv_trt_llm_request_metrics",
            "TRT LLM request metrics",
            "request_type",
            ["active", "max", "scheduled", "context", "waiting"],
        )
        self._families.append(fam)
        fam, self.m_ifb = family(
            "nv_trt_llm_inflight_batcher_metrics",
            "TRT LLM inflight_batcher-specific metrics",
            "inflight_batcher_specific_metric",
            ["paused_requests", "generation_requests", "total_context_tokens", "micro_batch_id"],
        )
        self._families.append(fam)
        fam, self.m_gen = family(
            "nv_trt_llm_general_metrics",
            "General TRT LLM metrics",
            "general_type",
            ["iteration_counter", "timestamp"],
        )
        self._families.append(fam)

    def _update_metrics(self):
        c = self.control.get()
        if c["freeze_metrics"]:
            return
        with self._state_lock:
            states = list(self._inflight.values())
            iteration = self._iteration
        max_blocks = max(int(c["kv_max_blocks"]), 0)
        per_block = max(int(c["kv_tokens_per_block"]), 1)
        max_req = max(int(c["max_requests"]), 0)
        active = len(states)
        scheduled = min(active, max_req)
        context = sum(1 for s in states if s["phase"] == "context")
        # Background occupancy from the control file plus the blocks of every live request.
        own = sum(
            math.ceil((int(s["prompt_tokens"]) + int(s["tokens"])) / per_block) for s in states
        )
        base = round(float(c["kv_used_fraction"]) * max_blocks)
        used = min(max_blocks, base + own)
        free = max_blocks - used
        kv = {
            "max": max_blocks,
            "free": free,
            "used": used,
            "tokens_per": per_block,
            "fraction": used / max_blocks if max_blocks else 0.0,
            "reused": int(c["kv_reused_blocks"]),
        }
        for key, value in kv.items():
            self.m_kv[key].set(float(value))
        req = {
            "active": active,
            "max": max_req,
            "scheduled": scheduled,
            "context": context,
            "waiting": active - scheduled,
        }
        for key, value in req.items():
            self.m_req[key].set(float(value))
        ctx_tokens = sum(int(s["prompt_tokens"]) for s in states if s["phase"] == "context")
        ifb = {
            "paused_requests": int(c["paused_requests"]),
            "generation_requests": active - context,
            "total_context_tokens": ctx_tokens,
            "micro_batch_id": 0,
        }
        for key, value in ifb.items():
            self.m_ifb[key].set(float(value))
        # Like the real backend, the iteration gauges only move when iterations happen (tokens
        # are generated); the timestamp is microseconds since the epoch, as in TRT-LLM >= 2024-07.
        if active or iteration == 0:
            self.m_gen["iteration_counter"].set(float(iteration))
            self.m_gen["timestamp"].set(float(time.time_ns() // 1000))

    def _poll_metrics(self):
        while not self._stop.wait(0.1):
            try:
                self._update_metrics()
            except Exception as exc:  # keep polling; a metrics hiccup must not stop serving
                pb_utils.Logger.log_warn(f"fake_llm metrics update failed: {exc!r}")

    # -- serving -----------------------------------------------------------------------------

    def _send(self, sender, request_id, index, final, response=None):
        # Timestamp taken just before handing the response to Triton, so a client on the same
        # host always receives it at or after t_ns (send() itself returns only after the IPC).
        t_ns = time.monotonic_ns()
        if response is None:
            sender.send(flags=FINAL)
        else:
            sender.send(response, flags=FINAL if final else 0)
        self._record(request_id, index, final, t_ns)

    def _record(self, request_id, index, final, t_ns):
        if self._log is None:
            return
        line = json.dumps({"request_id": request_id, "index": index, "t_ns": t_ns, "final": final})
        with self._log_lock:
            self._log.write(line + "\n")

    def execute(self, requests):
        for request in requests:
            t = threading.Thread(target=self._serve, args=(request,), daemon=True)
            with self._state_lock:
                self._threads.add(t)
            t.start()
        # Decoupled: every response goes through the request's response sender.
        return None

    def _serve(self, request):
        sender = request.get_response_sender()
        request_id = request.request_id() or uuid.uuid4().hex
        key = uuid.uuid4().hex
        try:
            self._generate(request, sender, request_id, key)
        except Exception as exc:
            # Never leave a stream open: an unexpected error still ends the request.
            try:
                err = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"fake_llm: {exc!r}"))
                self._send(sender, request_id, -1, True, err)
            except Exception:
                pass
        finally:
            with self._state_lock:
                self._inflight.pop(key, None)
                self._threads.discard(threading.current_thread())

    def _generate(self, request, sender, request_id, key):
        c = self.control.get()
        text_t = pb_utils.get_input_tensor_by_name(request, "text_input")
        prompt = b""
        if text_t is not None:
            arr = text_t.as_numpy().reshape(-1)
            if arr.size:
                prompt = arr[0] if isinstance(arr[0], bytes) else str(arr[0]).encode()
        n_tokens = int(c["tokens"])
        mt = pb_utils.get_input_tensor_by_name(request, "max_tokens")
        if mt is not None and mt.as_numpy().size:
            n_tokens = int(mt.as_numpy().reshape(-1)[0])
        stream = True
        st = pb_utils.get_input_tensor_by_name(request, "stream")
        if st is not None and st.as_numpy().size:
            stream = bool(st.as_numpy().reshape(-1)[0])
        n_tokens = max(n_tokens, 1)
        prompt_tokens = max(len(prompt.split()), 1)
        with self._state_lock:
            self._inflight[key] = {"phase": "context", "prompt_tokens": prompt_tokens, "tokens": 0}

        fail = bool(c["fail"]) or random.random() < float(c["fail_rate"])
        fail_after = c["fail_after_tokens"]
        ttft = float(c["ttft_ms"]) / 1000.0
        itl = float(c["itl_ms"]) / 1000.0

        time.sleep(ttft)
        if fail:
            err = pb_utils.InferenceResponse(
                error=pb_utils.TritonError("fake_llm: injected failure")
            )
            self._send(sender, request_id, 0, True, err)
            return

        pieces = []
        for i in range(n_tokens):
            if i:
                time.sleep(itl)
            if fail_after is not None and i >= int(fail_after):
                err = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"fake_llm: injected failure after {i} tokens")
                )
                self._send(sender, request_id, i, True, err)
                return
            token = f" tok{i}"
            with self._state_lock:
                state = self._inflight[key]
                state["phase"] = "generation"
                state["tokens"] = i + 1
                self._iteration += 1
            if stream:
                out = pb_utils.Tensor("text_output", np.array([token.encode()], dtype=np.object_))
                self._send(sender, request_id, i, False, pb_utils.InferenceResponse([out]))
            else:
                pieces.append(token)
        if stream:
            # Empty final response, as the TRT-LLM backend sends it when streaming.
            self._send(sender, request_id, n_tokens, True)
        else:
            # Non-streaming (e.g. POST /generate): one response holding the whole text.
            text = "".join(pieces).encode()
            out = pb_utils.Tensor("text_output", np.array([text], dtype=np.object_))
            self._send(sender, request_id, 0, True, pb_utils.InferenceResponse([out]))

    def finalize(self):
        self._stop.set()
        deadline = time.monotonic() + 5.0
        with self._state_lock:
            threads = list(self._threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self._log is not None:
            self._log.close()
