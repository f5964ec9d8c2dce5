"""Dynamic-batching model for the Tritonwatch rig (runs inside Triton's Python backend stub).

OUTPUT0 = 2 * INPUT0. Each execution (one batch formed by Triton's dynamic batcher) sleeps
``batch_exec_ms + item_exec_ms * batch_size`` so that, under concurrent load, requests queue while
the single instance is busy and the next batch grows. Knobs come from the JSON control file named
by $TRITONWATCH_RIG_CONTROL, read on every execution:

- ``batch_exec_ms`` (default 5): fixed time per execution.
- ``item_exec_ms`` (default 0): extra time per request in the batch.
- ``batcher_fail`` (default false): answer every request with an error.

The batch sizes formed are bounded by how many requests are waiting, so they are shrunk from the
client side: fewer concurrent clients (LoadGenerator.set(concurrency=...)) give smaller batches.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULTS: dict[str, object] = {"batch_exec_ms": 5.0, "item_exec_ms": 0.0, "batcher_fail": False}


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
        self.control = _Control(os.environ.get("TRITONWATCH_RIG_CONTROL"))

    def execute(self, requests):
        c = self.control.get()
        delay_ms = float(c["batch_exec_ms"]) + float(c["item_exec_ms"]) * len(requests)
        if delay_ms > 0:
            time.sleep(delay_ms / 1000.0)
        if c["batcher_fail"]:
            err = pb_utils.TritonError("batcher: injected failure")
            return [pb_utils.InferenceResponse(error=err) for _ in requests]
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
