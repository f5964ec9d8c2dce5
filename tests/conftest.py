"""Shared fixtures: a real PostgreSQL and a real tritonserver are started by their plugins."""

from __future__ import annotations

import pytest

from tests import background

pytest_plugins = [
    "tests.fixtures_pg",
    "tests.fixtures_rig",
    "tests.fixtures_http",
    "tests.fixtures_openai",
    "tests.fixtures_alertmanager",
    "tests.fixtures_store",
]

#: Fault tests that live beside the code they exercise; with everything under tests/faults/ they
#: make up the fault suite (`pytest -m fault`, README "Faults").
HELD_FAULTS = (
    "tests/collector/test_scrape.py::test_down_target_names_the_target",
    "tests/collector/test_scrape.py::test_slow_target_is_cut_at_its_timeout",
    "tests/collector/test_scrape.py::test_endless_body_is_cut_by_size_or_deadline",
    "tests/collector/test_scrape.py::test_urls_are_redacted",
    "tests/collector/test_jobs.py::test_broken_targets_are_marked_down_and_never_delay_the_good_one",
    "tests/collector/test_jobs.py::test_a_huge_slow_path_body_does_not_delay_other_targets",
    "tests/collector/test_jobs.py::test_model_configs_are_written_only_when_changed_and_health_su",
    "tests/store/test_contract.py::test_failed_flush_keeps_the_buffer_and_a_later_flush_retries",
    "tests/store/test_contract.py::test_buffer_is_bounded_during_an_outage",
    "tests/alerts/test_receiver.py::test_oversized",
    "tests/alerts/test_receiver.py::test_unauthenticated",
    "tests/alerts/test_receiver.py::test_malformed_payloads_get_422",
    "tests/alerts/test_notify.py::test_real_alertmanager_outage_loses_no_notification",
    "tests/alerts/test_notify.py::test_redact_url",
    "tests/alerts/test_engine.py::test_a_store_outage_loses_no_event",
    "tests/e2e/test_alerting_e2e.py::test_a_restart_mid_incident_neither_repages_nor_loses_the_re",
    "tests/e2e/test_alerting_e2e.py::test_alertmanager_down_loses_no_notification",
    "tests/cli/test_serve.py::test_serve_shuts_down_cleanly_when_the_final_flush_fails",
    "tests/store/test_contract_tsdb.py::test_errors_name_the_endpoint_without_its_secrets",
    "tests/store/test_contract_tsdb.py::test_a_tsdb_that_never_answers_times_out_naming_the_endpoi",
    "tests/store/test_contract_tsdb.py::test_a_response_over_the_byte_bound_is_refused",
    "tests/store/test_contract_tsdb.py::test_limits_refuse_before_reading",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(("tests/faults/", *HELD_FAULTS)):
            item.add_marker(pytest.mark.fault)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Background scenarios (tests/background.py) of the tests that will run start now, and
    their tests move to the end, so that the scenarios run beside the rest of the suite."""
    if session.config.option.collectonly:
        return
    late = [item for item in session.items if item.name in background.REGISTRY]
    for item in late:
        session.items.remove(item)
        session.items.append(item)
        background.REGISTRY[item.name].start()


def pytest_sessionfinish() -> None:
    for bg in background.REGISTRY.values():
        bg.cancel(timeout=240)
