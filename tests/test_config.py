import pytest

from tritonwatch.schemas.config import DEFAULT_STORE_URL, ConfigError, load_config, validate_config
from tritonwatch.schemas.values import format_duration, parse_duration, parse_size

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


@pytest.mark.parametrize("seconds", [0.5, 1, 45, 90.5, 300, 3600, 5400, 259200, 28 * 86400])
def test_a_formatted_duration_parses_back_to_itself(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


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


# --- secrets in headers --------------------------------------------------------------------

SECRET = "s3cr3t-token-value"


def _with_headers(where: str, headers: dict[str, str]) -> dict[str, object]:
    """A config whose one target (or probe) sends ``headers``."""
    if where == "targets":
        return {"targets": [{"name": "a", "metrics_url": "http://x/metrics", "headers": headers}]}
    return {"probes": [{"name": "p", "url": "h:8001", "model": "m", "headers": headers}]}


@pytest.mark.parametrize(
    "value",
    [f"Bearer {SECRET}\n", f"Bearer {SECRET}\r\nX-Injected: y", f"Bearer\x00{SECRET}",
     f"Bearer {SECRET}\x7f", f"Bearer {SECRET}\x85", f"Bearer\t{SECRET}"],
    ids=["LF", "CRLF injection", "NUL", "DEL", "C1 NEL", "TAB"],
)
@pytest.mark.parametrize("where", ["targets", "probes"])
def test_control_characters_in_header_values_are_refused_without_quoting_them(where, value):
    headers = {"Authorization": value}
    with pytest.raises(ConfigError) as info:
        validate_config(_with_headers(where, headers))
    (line,) = info.value.errors
    assert line.startswith(f"{where}[0].headers: header 'Authorization': value contains")
    assert SECRET not in str(info.value) and SECRET not in repr(info.value.errors)


@pytest.mark.parametrize("name", ["X-Bad\r\nInjected", "Bad Name", "Colon:", "", "Nul\x00"])
@pytest.mark.parametrize("where", ["targets", "probes"])
def test_header_names_must_be_http_tokens(where, name):
    headers = {name: SECRET}
    with pytest.raises(ConfigError) as info:
        validate_config(_with_headers(where, headers))
    (line,) = info.value.errors
    assert line.startswith(f"{where}[0].headers: header name {name!r} is not a valid")
    assert SECRET not in str(info.value)


def test_ordinary_headers_are_kept():
    headers = {"Authorization": f"Bearer {SECRET}", "X-Api-Key": "a b=c;d/é"}
    config = validate_config({
        "targets": [{"name": "a", "metrics_url": "http://x/metrics", "headers": headers}],
        "probes": [{"name": "p", "url": "h:8001", "model": "m", "headers": headers}],
    })
    assert config.targets[0].headers == headers and config.probes[0].headers == headers


def test_validation_error_text_never_quotes_header_values():
    from pydantic import ValidationError

    from tritonwatch.schemas.config import Config
    from tritonwatch.schemas.probes import ProbeConfig

    bad = {"Authorization": f"Bearer {SECRET}\n"}
    with pytest.raises(ValidationError) as info:
        Config.model_validate({"targets": [{"name": "a", "metrics_url": "http://x/m",
                                            "headers": bad}]})
    assert SECRET not in str(info.value)
    with pytest.raises(ValidationError) as info:
        ProbeConfig(name="p", url="h:8001", model="m", headers=bad)
    assert SECRET not in str(info.value)


# --- validation gaps -----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "Infinity", float("nan"), float("inf"),
                                  "1e999", "9" * 400 + "s"])
def test_non_finite_durations_are_refused_naming_the_input(text):
    with pytest.raises(ValueError, match="must be a finite number") as info:
        parse_duration(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({"scrape": {"interval": "nan"}}, "scrape.interval: invalid duration 'nan'"),
        ({"scrape": {"interval": "inf", "timeout": "inf"}}, "scrape.timeout: invalid duration"),
        ({"store": {"flush_interval": float("nan")}}, "store.flush_interval: invalid duration"),
    ],
)
def test_non_finite_durations_in_the_file_name_their_key(data, line):
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    assert any(e.startswith(line) for e in info.value.errors), info.value.errors


@pytest.mark.parametrize("raw", ["5m", "10m", "1s", 600])
def test_raw_retention_must_exceed_the_series_cache_lifetime(raw):
    with pytest.raises(ConfigError) as info:
        validate_config({"store": {"retention": {"raw": raw}}})
    (line,) = info.value.errors
    assert line.startswith("store.retention.raw: must exceed 10 minutes")


def test_raw_retention_just_over_ten_minutes_is_fine():
    assert validate_config({"store": {"retention": {"raw": "10m1s"}}}).store.retention.raw == 601


@pytest.mark.parametrize(("raw", "ttl"), [
    ("10m1s", 600.0), ("20m", 600.0), ("50m", 1500.0), ("2h", 3600.0), ("15d", 3600.0),
])
def test_series_ids_are_kept_half_the_raw_retention_between_ten_minutes_and_an_hour(raw, ttl):
    retention = validate_config({"store": {"retention": {"raw": raw}}}).store.retention
    assert retention.series_cache_ttl == ttl
    # Retention may delete an empty series that no writer resolved for the raw retention:
    # a writer resolves the ids it holds again well within it.
    assert retention.series_cache_ttl < retention.raw


def test_target_scrape_timeout_over_its_interval_is_refused_not_clamped():
    target = {"name": "a", "metrics_url": "http://x/metrics"}
    with pytest.raises(ConfigError) as info:
        validate_config({"targets": [
            {**target, "name": "ok", "scrape_interval": "30s", "scrape_timeout": "20s"},
            {**target, "scrape_interval": "5s", "scrape_timeout": "30s"},
        ]})
    assert info.value.errors == [
        "targets[1].scrape_timeout: 30s must not exceed the target's scrape interval (5s)"
    ]
    # Against the global interval when the target has none of its own.
    with pytest.raises(ConfigError, match=r"targets\[0\]\.scrape_timeout: 20s .* \(15s\)"):
        validate_config({"targets": [{**target, "scrape_timeout": "20s"}]})
    # An inherited scrape.timeout is still capped at a shorter per-target interval.
    config = validate_config({"targets": [{**target, "scrape_interval": "5s"}]})
    assert config.timeout_for(config.targets[0]) == 5
    config = validate_config({"targets": [{**target, "scrape_timeout": "15s"}]})
    assert config.timeout_for(config.targets[0]) == 15


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "names no database file"),
        ("sqlite:///", "names no database file"),
        ("sqlite:///:memory:", "names no database file"),
        ("sqlite:", "is not a database URL"),
        ("postgresql://user:hunter2@[::1", "is not a database URL"),
    ],
)
def test_store_urls_the_store_would_refuse_fail_validation(url, message):
    with pytest.raises(ConfigError) as info:
        validate_config({"store": {"url": url}})
    (line,) = info.value.errors
    assert line.startswith(f"store.url: {message}")
    assert "hunter2" not in line


@pytest.mark.parametrize("url", [DEFAULT_STORE_URL, "sqlite:////abs/tw.db",
                                 "postgresql://u:p@db/tw", "postgresql+psycopg://db/tw"])
def test_store_urls_the_store_accepts_pass(url):
    from tritonwatch.store.engine import parse_url

    parse_url(url)  # the store agrees
    assert validate_config({"store": {"url": url}}).store.url == url


@pytest.mark.parametrize("listen", ["0.0.0.0:99999", "127.0.0.1:0", "[::1]:65536"])
def test_api_listen_port_must_be_in_range(listen):
    with pytest.raises(ConfigError, match=r"api\.listen: .*port \d+ is outside 1-65535"):
        validate_config({"api": {"listen": listen}})


@pytest.mark.parametrize("listen", ["0.0.0.0:1", "[::1]:65535", "localhost:8080"])
def test_api_listen_ports_in_range_pass(listen):
    assert validate_config({"api": {"listen": listen}}).api.listen == listen


def test_token_from_environment_wins_over_the_file(monkeypatch):
    monkeypatch.setenv("TRITONWATCH_API_TOKEN", "a-real-secret-of-32-characters!!")
    config = validate_config({"api": {"token": "the-file-token-of-32-characters!", "listen":
                                      "127.0.0.1:9000"}})
    assert config.api.token == "a-real-secret-of-32-characters!!"
    assert config.api.listen == "127.0.0.1:9000"
    monkeypatch.setenv("TRITONWATCH_API_TOKEN", "")  # empty: unset
    assert validate_config({"api": {"token": "the-file-token-of-32-characters!"}}).api.token == (
        "the-file-token-of-32-characters!"
    )


def test_a_placeholder_token_from_the_environment_says_where_it_came_from(monkeypatch):
    monkeypatch.setenv("TRITONWATCH_API_TOKEN", "changeme")
    with pytest.raises(ConfigError) as info:
        validate_config({"api": {"token": "the-file-token-of-32-characters!"}})
    (line,) = info.value.errors
    assert line.startswith("api.token: is a placeholder") and "TRITONWATCH_API_TOKEN" in line


# --- secrets, size bounds and ${VAR} (schemas/configfile.py) --------------------------------

def test_url_errors_mask_userinfo_and_query_and_webhook_urls_entirely():
    data = {
        "targets": [{"name": "a", "metrics_url": "htps://admin:Pw1@h:8002/m?token=QTok123#frag",
                     "grpc_url": "user:GrpcPw@h:99999"}],
        "alerting": {"webhooks": [{"url": "htps://hooks.example/services/HookTok"}]},
    }
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    joined = "\n".join(info.value.errors)
    assert ("targets[0].metrics_url: 'htps://<redacted>@h:8002/m?<redacted>#<redacted>' is not "
            "an http(s) URL") in info.value.errors
    assert "alerting.webhooks[0].url: is not an http(s) URL (value not shown" in joined
    for secret in ("Pw1", "QTok123", "frag", "GrpcPw", "HookTok", "hooks.example"):
        assert secret not in joined


def test_header_values_and_tokens_are_scrubbed_from_any_error_line():
    # A header value is a secret even where a validator quotes it (a probe's url here).
    data = {"targets": [{"name": "a", "metrics_url": "http://h/m",
                         "headers": {"Authorization": "Bearer HdrTok-123456"}}],
            "probes": [{"name": "p", "url": "HdrTok-123456", "model": "m"}]}
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    assert "HdrTok-123456" not in "\n".join(info.value.errors)
    assert any(line.startswith("probes[0]") for line in info.value.errors)


def test_expanded_size_is_the_json_length_and_counts_every_alias():
    import json

    from tritonwatch.schemas.configfile import expanded_size

    shared = {"k": ["a", 1, 2.5, None, True]}
    data = {"x": [shared, shared, shared], "y": "é"}
    assert expanded_size(data) == len(json.dumps(data, separators=(",", ":"),
                                                 ensure_ascii=False).encode())


def test_a_bomb_in_probe_parameters_names_the_key_and_the_bound():
    level: list[object] = ["lol"] * 9
    for _ in range(4):
        level = [level] * 9  # shared, as YAML aliases are: tiny in memory
    probe = {"name": "p", "url": "http://h:8000", "protocol": "http", "model": "m",
             "parameters": {"bomb": level}}
    with pytest.raises(ConfigError) as info:
        validate_config({"probes": [probe]})
    (line,) = info.value.errors
    assert line.startswith("probes[0].parameters: expands to ")
    assert line.endswith("the limit is 64 KiB")


def test_a_recursive_value_is_refused():
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ConfigError, match=r"targets\[0\]: refers to itself"):
        validate_config({"targets": loop})


@pytest.mark.parametrize(("text", "env", "value"), [
    ("${A}", {"A": "x"}, "x"),
    ("pre-${A}-post", {"A": "x"}, "pre-x-post"),
    ("${A:-dflt}", {}, "dflt"),
    ("${A:-dflt}", {"A": ""}, "dflt"),
    ("${A-dflt}", {"A": ""}, ""),
    ("${A-dflt}", {}, "dflt"),
    ("$${A} and $A", {"A": "x"}, "${A} and $A"),
    ("pa$$word", {}, "pa$$word"),
], ids=["plain", "inside", "default-unset", "default-empty", "dash-set-empty", "dash-unset",
        "escaped", "lone-dollars"])
def test_env_references_expand_like_compose(text, env, value):
    from tritonwatch.schemas.configfile import expand_env

    data, errors, _ = expand_env({"k": [text]}, env)
    assert errors == [] and data == {"k": [value]}


def test_unset_and_malformed_env_references_name_the_key_never_a_value():
    with pytest.raises(ConfigError) as info:
        validate_config({"store": {"url": "postgresql://u:${PGPW}@db/x"},
                         "api": {"listen": "${1BAD}"}}, environ={"OTHER": "v"})
    assert info.value.errors == [
        "store.url: environment variable PGPW is not set (set it, or write ${PGPW:-default} "
        "for a fallback)",
        "api.listen: malformed environment reference (use ${NAME}, ${NAME:-default} or "
        "${NAME-default}; write $${ for a literal ${)",
    ]


def test_aliased_values_stay_shared_after_expansion():
    from tritonwatch.schemas.configfile import expand_env

    shared = {"a": "${X}"}
    data, _, used = expand_env({"p": [shared, shared]}, {"X": "1"})
    assert data["p"][0] is data["p"][1] and data["p"][0] == {"a": "1"} and used == {"X": "1"}


def test_yaml_errors_do_not_quote_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("api:\n  token: Tok-0123456789abcdef: oops\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (line,) = info.value.errors
    assert line.startswith("line 2, column ") and "invalid YAML" in line
    assert "Tok-0123456789abcdef" not in line


def test_non_utf8_and_oversized_files_are_refused(tmp_path):
    from tritonwatch.schemas import configfile

    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"# ok\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"line 2: not UTF-8 text \(byte 0xE9 at offset 10\)"):
        load_config(latin1)
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (configfile.MAX_FILE_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than 8 MiB"):
        load_config(huge)


def test_nesting_is_bounded_before_anything_recurses_into_it(tmp_path):
    from tritonwatch.schemas import configfile

    deep: list[object] = []
    for _ in range(configfile.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ConfigError, match=r"nested more than 64 levels deep"):
        validate_config({"targets": deep})
    path = tmp_path / "deep.yaml"  # deeper than PyYAML's own recursion can parse
    path.write_text("targets: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(path)
