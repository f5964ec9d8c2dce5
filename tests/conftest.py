"""Shared fixtures: a real PostgreSQL and a real tritonserver are started by their plugins."""

pytest_plugins = [
    "tests.fixtures_pg",
    "tests.fixtures_rig",
    "tests.fixtures_http",
    "tests.fixtures_openai",
    "tests.fixtures_alertmanager",
    "tests.fixtures_store",
]
