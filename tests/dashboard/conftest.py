"""Stores the dashboard tests read: one filled by the real collector from the rig (shared by
the module's tests, ~30 s to fill), one holding a synthetic week, one empty."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.fill import fill_from_rig, synthetic_week, write_config
from tests.fixtures_http import free_port, serve_fake_targets
from tritonwatch.rig import TritonRig
from tritonwatch.store import open_store


@dataclass(frozen=True)
class Filled:
    config: Path
    url: str
    info: dict[str, Any]


@pytest.fixture(scope="session")
def rig_store(triton_rig: TritonRig, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Filled]:
    d = tmp_path_factory.mktemp("dash-rig")
    url = f"sqlite:///{d}/tw.db"
    with serve_fake_targets() as edge:
        config = write_config(d, rig=triton_rig, db_url=url, edge_url=edge.url("/ok"),
                              down_url=f"http://127.0.0.1:{free_port()}/metrics")
        info = fill_from_rig(config, triton_rig, edge)
    yield Filled(config, url, info)


WEEK_RULES = """\
version: 1
slos:
  - name: resnet-availability
    objective: 99.9
    window: 28d
    sli: {kind: availability, model: resnet}
"""


@pytest.fixture(scope="session")
def week_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    import time

    d = tmp_path_factory.mktemp("dash-week")
    url = f"sqlite:///{d}/tw.db"
    config = write_config(d, rig=None, db_url=url, rules=WEEK_RULES)
    now = time.time()
    with open_store(url) as store:
        store.migrations.apply()
        synthetic_week(store, now=now)
    yield Filled(config, url, {"now": now})


@pytest.fixture
def empty_store(tmp_path: Path) -> Filled:
    url = f"sqlite:///{tmp_path}/tw.db"
    with open_store(url) as store:
        store.migrations.apply()
    config = write_config(tmp_path, rig=None, db_url=url, rules="version: 1\n")
    return Filled(config, url, {})
