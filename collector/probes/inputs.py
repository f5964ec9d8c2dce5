"""Which inputs a streaming probe sends: only those the model declares, in its data types.

LLM front-ends on Triton declare different inputs for the same job, and Triton rejects a request
carrying an input the model does not declare (``expected 2 inputs but got 3 inputs``) or one of
another data type or shape.  So a stream probe reads the model's metadata (names, data types,
shapes) and configuration (which inputs are ``optional``) once, and plans its requests from them:

- the prompt goes into ``input_name`` (default ``text_input``), which must be a BYTES input;
- ``max_tokens`` goes into ``max_tokens_input`` in its declared integer type (TensorRT-LLM:
  INT32; hand-written Python models: often INT64 or UINT32), and into the ``sampling_parameters``
  JSON when the model declares that BYTES input (the vLLM backend reads max_tokens only there);
- ``stream_input`` gets True when declared as a BOOL;
- a key of the probe's ``parameters`` that names a declared input fills that input (converted to
  its data type; a dict or list becomes JSON text for a BYTES input) instead of being sent as a
  request parameter, the way Triton's HTTP generate endpoint treats the keys of its JSON body;
  a ``sampling_parameters`` dict is merged with the probe's max_tokens;
- every other declared input is left out; a required one the probe cannot fill is a
  :class:`ProbeFailure` naming the model and the input.

The plan is cached per probe and dropped after any failed request (:class:`PlanCache`), so a
model reloaded with other inputs is read again.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritonwatch.collector.probes.base import ProbeFailure
from tritonwatch.schemas.probes import ProbeConfig

#: More declared inputs than this is no LLM front-end (and not worth planning for).
MAX_INPUTS = 256
#: Declared elements of one input the probe fills with its single value.
MAX_ELEMENTS = 4096
#: The error code of every planning failure (``ProbeResult.error_code``).
ERROR_CODE = "model_inputs"
#: The vLLM backend's JSON input for sampling parameters (max_tokens among them).
SAMPLING_PARAMETERS = "sampling_parameters"

_INT_TYPES: dict[str, type[np.integer[Any]]] = {
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
}
_FLOAT_TYPES: dict[str, type[np.floating[Any]]] = {
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
#: numpy type of each KServe data type the probe can fill.
NP_TYPES: dict[str, Any] = {**_INT_TYPES, **_FLOAT_TYPES, "BOOL": np.bool_, "BYTES": np.object_}

Value = str | int | float | bool


@dataclass(frozen=True, slots=True)
class DeclaredInput:
    """One input as the model declares it; ``shape`` includes the batch dimension, -1 = any."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool

    def describe(self) -> str:
        return f"{self.name} ({self.datatype} {list(self.shape)})"


@dataclass(frozen=True, slots=True)
class ModelInputs:
    model: str
    inputs: tuple[DeclaredInput, ...]

    def get(self, name: str | None) -> DeclaredInput | None:
        if name is None:
            return None
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None

    def names(self, limit: int = 20) -> str:
        names = [i.describe() for i in self.inputs[:limit]]
        more = len(self.inputs) - limit
        return ", ".join(names) + (f" and {more} more" if more > 0 else "") or "none"


@dataclass(frozen=True, slots=True)
class PlannedInput:
    """One input of every request: its value is the prompt (``value is None``) or a constant."""

    name: str
    datatype: str
    shape: tuple[int, ...]  # concrete: every variable dimension (and the batch) is 1
    value: Value | None

    @property
    def is_prompt(self) -> bool:
        return self.value is None

    def array(self, prompt: str) -> np.ndarray:
        """The tensor of this input (numpy), the prompt filled in where it goes."""
        value: Any = prompt if self.value is None else self.value
        if self.datatype == "BYTES":
            value = value.encode() if isinstance(value, str) else value
        return np.full(self.shape, value, dtype=NP_TYPES[self.datatype])


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """The inputs of a stream probe's requests, and the request parameters left over."""

    model: str
    inputs: tuple[PlannedInput, ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def http_body(self, prompt: str, request_id: str) -> dict[str, Any]:
        """A generate / generate_stream body: a JSON key per input, then the parameters."""
        body: dict[str, Any] = {"id": request_id}
        for spec in self.inputs:
            body[spec.name] = prompt if spec.value is None else spec.value
        body.update(self.parameters)
        return body


def parse_model_inputs(
    model: str, metadata: Mapping[str, Any], config: Mapping[str, Any]
) -> ModelInputs:
    """The declared inputs from Triton's model metadata and configuration (JSON, HTTP or gRPC).

    gRPC's JSON renders int64 as strings and leaves out ``optional: false``; HTTP's does
    neither; the configuration may come wrapped in ``{"config": ...}`` (gRPC).
    """
    if isinstance(config.get("config"), Mapping):
        config = config["config"]
    raw = metadata.get("inputs")
    if not isinstance(raw, list):
        raise _failure(model, "its metadata lists no `inputs`")
    if len(raw) > MAX_INPUTS:
        raise _failure(model, f"it declares {len(raw)} inputs, more than {MAX_INPUTS}")
    optional: set[str] = set()
    for entry in config.get("input") or ():
        if isinstance(entry, Mapping) and entry.get("optional") is True:
            optional.add(str(entry.get("name")))
    inputs = []
    for entry in raw:
        try:
            name = str(entry["name"])
            datatype = str(entry["datatype"]).upper()
            shape = tuple(int(d) for d in entry.get("shape") or ())
        except (KeyError, TypeError, ValueError):
            raise _failure(
                model, f"its metadata has a malformed input: {str(entry)[:200]}"
            ) from None
        inputs.append(DeclaredInput(name, datatype, shape, name in optional))
    return ModelInputs(model, tuple(inputs))


def plan_request(config: ProbeConfig, declared: ModelInputs) -> RequestPlan:
    """Which inputs a stream probe sends to this model, and with what; ProbeFailure if it can't.

    Raises ProbeFailure("protocol", code ``model_inputs``) naming the model and the input when
    the prompt has no BYTES input to go to, a required input cannot be filled, or a
    ``parameters`` value does not fit its input's data type.
    """
    model = declared.model
    values: dict[str, Value] = {}
    prompt_spec = declared.get(config.input_name)
    if prompt_spec is None:
        raise _failure(
            model, f"it declares no input {config.input_name!r} for the prompt (declared: "
            f"{declared.names()}); set the probe's `input_name`",
        )
    if prompt_spec.datatype != "BYTES":
        raise _failure(
            model, f"its prompt input {prompt_spec.describe()} is not BYTES (text); set the "
            "probe's `input_name` to the model's text input",
        )
    max_tokens = declared.get(config.max_tokens_input)
    if max_tokens is not None and max_tokens.datatype in _INT_TYPES:
        values[max_tokens.name] = _fit(model, max_tokens, config.max_tokens, "max_tokens")
    stream = declared.get(config.stream_input)
    if stream is not None and stream.datatype == "BOOL":
        values[stream.name] = True

    parameters = dict(config.parameters)
    sampling = declared.get(SAMPLING_PARAMETERS)
    if sampling is not None and sampling.datatype == "BYTES":
        extra = parameters.pop(sampling.name, None)
        merged = _sampling_parameters(model, extra)
        if config.max_tokens_input is not None:
            merged.setdefault("max_tokens", config.max_tokens)
        if merged:
            values[sampling.name] = json.dumps(merged, separators=(",", ":"))
    if prompt_spec.name in parameters:
        raise _failure(model, f"parameters.{prompt_spec.name} would replace the prompt")
    for key in list(parameters):
        spec = declared.get(key)
        if spec is not None:
            values[key] = _fit(model, spec, parameters.pop(key), f"parameters.{key}")

    planned = [PlannedInput(prompt_spec.name, "BYTES", _concrete(model, prompt_spec), None)]
    for spec in declared.inputs:
        if spec is prompt_spec:
            continue
        if spec.name in values:
            planned.append(PlannedInput(
                spec.name, spec.datatype, _concrete(model, spec), values[spec.name]
            ))
        elif not spec.optional:
            raise _failure(
                model, f"it requires input {spec.describe()}, which the probe cannot fill; "
                f"give it a value under the probe's `parameters` ({spec.name}: ...)"
                + _hint(config, spec),
            )
    return RequestPlan(model, tuple(planned), parameters)


class PlanCache:
    """One probe's request plan, shared by its sessions; read once, dropped after a failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plan: RequestPlan | None = None

    def get(self, load: Callable[[], RequestPlan]) -> RequestPlan:
        # Under the lock: concurrent sessions of a new probe wait for one read, not N.
        with self._lock:
            if self._plan is None:
                self._plan = load()
            return self._plan

    def invalidate(self) -> None:
        with self._lock:
            self._plan = None


def _failure(model: str, reason: str) -> ProbeFailure:
    return ProbeFailure("protocol", f"model {model!r}: {reason}", ERROR_CODE)


def _hint(config: ProbeConfig, spec: DeclaredInput) -> str:
    if spec.datatype in _INT_TYPES and spec.name != config.max_tokens_input:
        return f", or set `max_tokens_input: {spec.name}` if it is the token limit"
    if spec.datatype == "BOOL" and spec.name != config.stream_input:
        return f", or set `stream_input: {spec.name}` if it turns streaming on"
    return ""


def _concrete(model: str, spec: DeclaredInput) -> tuple[int, ...]:
    # Batch dimension and variable dimensions: 1 (one request, one prompt).
    shape = tuple(1 if d < 0 else d for d in spec.shape) or (1,)
    if math.prod(shape) > MAX_ELEMENTS:
        raise _failure(model, f"input {spec.describe()} has more than {MAX_ELEMENTS} elements")
    return shape


def _sampling_parameters(model: str, extra: Any) -> dict[str, Any]:
    if extra is None:
        return {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError:
            raise _failure(model, "parameters.sampling_parameters is not JSON") from None
    if not isinstance(extra, Mapping):
        raise _failure(model, "parameters.sampling_parameters is not a JSON object")
    return dict(extra)


def _fit(model: str, spec: DeclaredInput, value: Any, where: str) -> Value:
    """``value`` as a JSON-able scalar of ``spec``'s data type, or ProbeFailure naming ``where``."""
    dtype = spec.datatype
    bad = _failure(model, f"{where}={str(value)[:100]!r} does not fit input {spec.describe()}")
    if dtype == "BYTES":
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if dtype == "BOOL":
        if isinstance(value, bool):
            return value
        raise bad
    if dtype in _INT_TYPES:
        info = np.iinfo(_INT_TYPES[dtype])
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        if not info.min <= value <= info.max:
            raise bad
        return value
    if dtype in _FLOAT_TYPES:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad
        if not abs(value) <= float(np.finfo(_FLOAT_TYPES[dtype]).max):  # NaN fails too
            raise bad
        return float(value)
    raise _failure(model, f"{where}: the probe cannot send input {spec.describe()}")

