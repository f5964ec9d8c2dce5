import pytest

from schemas.config import (
    DEFAULT_STORE_URL,
    ConfigError,
    load_config,
    parse_duration,
    parse_size,
    validate_config,
)

GOOD = """
version: 1
scrape: {interval: 15s, timeout: 5s, max_body_bytes: 10MiB}
store:
  url: sqlite:///data/tw.db
  retention: {raw: 7d}
targets:
  - name: triton-a
    metrics_url: http://10.0.0.1:8002/metrics
    http_url: http://10.0.0.1:8000
    grpc_url: 10.0.0.1:8001
    headers: {Authorization: Bearer abc}
    labels: {cluster: west}
    scrape_interval: 30s
  - name: triton-b
    metrics_url: https://b.example/metrics
    max_batch_size: {resnet: 16}
"""


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15), ("1h30m", 5400), ("500ms", 0.5), ("28d", 28 * 86400), (2.5, 2.5), ("7", 7)],
    ids=["seconds", "compound", "milliseconds", "days", "float", "numeric string"],
)
def test_durations_parse_like_prometheus(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "15", "1x", "m5", "5m 3s", "-1s", True])
def test_bad_durations_are_refused_with_the_input_quoted(text):
    if text == "15":  # plain numbers are seconds
        assert parse_duration(text) == 15
        return
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_sizes():
    assert parse_size("10MiB") == 10 * 1024 * 1024
    assert parse_size(1000) == 1000
    with pytest.raises(ValueError, match="invalid size"):
        parse_size("ten megs")


def test_good_file_loads_with_overrides(tmp_path):
    path = tmp_path / "tw.yaml"
    path.write_text(GOOD)
    config = load_config(path)
    a, b = config.targets
    assert config.interval_for(a) == 30 and config.interval_for(b) == 15
    assert config.timeout_for(a) == 5
    assert config.scrape.max_body_bytes == 10 * 1024 * 1024
    assert config.store.retention.raw == 7 * 86400
    assert b.max_batch_size == {"resnet": 16}
    assert a.labels == {"cluster": "west"}


def test_defaults_need_no_file():
    config = load_config(None)
    assert config.targets == ()
    assert config.store.url == DEFAULT_STORE_URL


def test_every_error_is_reported_with_its_key_path():
    data = {
        "targets": [
            {"name": "a", "metrics_url": "ftp://nope"},
            {"name": "a", "metrics_url": "http://x/metrics", "grpc_url": "no-port"},
            {"metrics_url": "http://x/metrics", "scrape_timeout": "soon"},
        ],
        "scrape": {"interval": "5s", "timeout": "10s"},
        "store": {"url": "mysql://x"},
        "surprise": True,
    }
    with pytest.raises(ConfigError) as info:
        validate_config(data, "tw.yaml")
    errors = info.value.errors
    joined = "\n".join(errors)
    assert "targets[0].metrics_url: 'ftp://nope' is not an http(s) URL" in errors
    assert "targets[1].grpc_url" in joined
    assert "targets[2].name: Field required" in errors
    assert "targets[2].scrape_timeout: invalid duration 'soon'" in joined
    assert "scrape: timeout (10s) must not exceed interval (5s)" in errors
    assert "store.url: must start with sqlite:/// or postgresql://" in errors
    assert "surprise: Extra inputs are not permitted" in errors


def test_duplicate_target_names_are_refused():
    target = {"name": "a", "metrics_url": "http://x/metrics"}
    with pytest.raises(ConfigError, match="used twice"):
        validate_config({"targets": [target, target]})


@pytest.mark.parametrize("token", ["changeme", "short"])
def test_placeholder_tokens_are_refused(token):
    with pytest.raises(ConfigError, match=r"api\.token: is a placeholder"):
        validate_config({"api": {"token": token}})


def test_token_from_environment(monkeypatch):
    monkeypatch.setenv("TRITONWATCH_API_TOKEN", "a-real-secret-of-32-characters!!")
    assert validate_config({}).api.token == "a-real-secret-of-32-characters!!"


def test_unreadable_and_invalid_yaml_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [\n  - name: a\n   oops: {")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert info.value.source == str(bad)
    assert "invalid YAML" in info.value.errors[0]


def test_config_is_frozen():
    config = validate_config({})
    with pytest.raises(ValueError, match="frozen"):
        config.scrape.interval = 1  # type: ignore[misc]
