"""Pytest plugin: one real tritonserver (the rig) per test session, plus load and control helpers.

Tests that use these fixtures should be marked ``@pytest.mark.triton``. The server is started on
first use (about 2 s once the Triton venv exists; creating ``.venv-triton`` downloads
nvidia-pytriton once) and stopped when the session ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tritonwatch.loadgen import LoadGenerator
from tritonwatch.rig import TritonRig


@pytest.fixture(scope="session")
def triton_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonRig]:
    """A started :class:`TritonRig` shared by the whole session."""
    rig = TritonRig(workdir=tmp_path_factory.mktemp("triton-rig"))
    rig.start()
    try:
        yield rig
    finally:
        rig.stop()


@pytest.fixture
def rig_control(triton_rig: TritonRig) -> Iterator[Callable[..., dict[str, Any]]]:
    """``rig_control(ttft_ms=200, ...)`` changes the live models; defaults come back afterwards."""
    yield triton_rig.control
    triton_rig.reset_control()


@pytest.fixture
def rig_load(triton_rig: TritonRig) -> Iterator[Callable[..., LoadGenerator]]:
    """``rig_load(concurrency=8, llm_concurrency=2)`` starts traffic; it is stopped afterwards."""
    started: list[LoadGenerator] = []

    def start(**kwargs: Any) -> LoadGenerator:
        kwargs.setdefault("max_duration", 120.0)
        gen = LoadGenerator(triton_rig.grpc_url, **kwargs)
        started.append(gen)
        gen.start()
        return gen

    yield start
    for gen in started:
        gen.stop()


def serve_config(rig: TritonRig, db: Path, flush_interval: str, *more: str) -> str:
    """A ``tritonwatch.yaml`` that scrapes ``rig`` every second (its API every 2 s) into the
    SQLite file ``db``; ``more`` adds top-level lines."""
    return (
        "targets:\n"
        f"  - {{name: rig, metrics_url: '{rig.metrics_url}', http_url: '{rig.http_url}'}}\n"
        "scrape: {interval: 1s, timeout: 1s, api_interval: 2s}\n"
        f"store: {{url: 'sqlite:///{db}', flush_interval: {flush_interval}}}\n"
        + "".join(f"{line}\n" for line in more)
    )
