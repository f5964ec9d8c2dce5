"""docker-compose.yml, the production layout (issue 18 item 5), checked without a Docker daemon
(none runs here, and this Docker has no compose plugin for `docker compose config`): the file
is parsed as Compose reads it (YAML with anchors and merge keys) and held to the layout's
promises, and the tritonwatch config it mounts goes through the real `tritonwatch check-config`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
#: What the compose file mounts and the environment it needs (values for the test only).
ENV = {"POSTGRES_PASSWORD": "pw-for-the-test", "TRITONWATCH_API_TOKEN": "token-for-the-test",
       "ALERT_WEBHOOK_URL": "http://hooks.invalid/x", "TRITON_MODEL_REPOSITORY": "/models"}
SECRET_NAME = re.compile(r"password|token|secret|webhook|api_key|credential", re.IGNORECASE)
ENV_REF = re.compile(r"^\$\{[A-Z_][A-Z0-9_]*(:[?-][^}]*)?\}$")


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def services() -> dict[str, dict[str, Any]]:
    return dict(compose()["services"])


def bind_sources(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume entry (short syntax)."""
    out = []
    for entry in service.get("volumes", []):
        text = str(entry)
        # a ${VAR:?message} source holds colons of its own
        cut = text.index("}") + 1 if text.startswith("${") else text.index(":")
        source, target = text[:cut], text[cut + 1:].split(":")[0]
        out.append((source, target))
    return out


def tritonwatch_config() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "deploy" / "tritonwatch.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_layout_has_every_part_of_production():
    svc = services()
    assert {"triton", "collector-a", "collector-b", "dashboard", "postgres", "victoriametrics",
            "alertmanager", "prometheus"} <= svc.keys()
    triton = svc["triton"]
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\$\{TRITON_TAG:-\d\d\.\d\d\}-py3",
                        triton["image"])
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert any(target == "/models" for _, target in bind_sources(triton))
    assert "--model-repository=/models" in triton["command"]
    # two collectors running `serve` on the one config file, which enables the cluster
    for name in ("collector-a", "collector-b"):
        assert svc[name]["command"][0] == "serve"
        assert ("./deploy/tritonwatch.yaml", "/etc/tritonwatch/tritonwatch.yaml") in \
            bind_sources(svc[name])
    assert svc["collector-a"]["hostname"] != svc["collector-b"]["hostname"]  # member names
    # each keeps its spill files and remote-write buffer in a volume of its own
    data = [{t: s for s, t in bind_sources(svc[n])}["/var/lib/tritonwatch"]
            for n in ("collector-a", "collector-b")]
    assert len(set(data)) == 2
    assert svc["dashboard"]["command"][0] == "dashboard"
    config = tritonwatch_config()
    assert config["cluster"]["enabled"] is True
    # the hosts the config names are services of this file
    hosts = {urlsplit(config["store"]["url"]).hostname,
             *(urlsplit(rw["url"]).hostname for rw in config["remote_write"]),
             *(urlsplit(am).hostname for am in config["alerting"]["alertmanagers"]),
             *(urlsplit(t["metrics_url"]).hostname for t in config["targets"])}
    assert hosts <= svc.keys(), hosts - svc.keys()
    # Prometheus scrapes each collector's /metrics on the port serve listens on
    prom = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    scraped = {t for job in prom["scrape_configs"] if job["job_name"] == "tritonwatch"
               for sc in job["static_configs"] for t in sc["targets"]}
    listen_port = config["api"]["listen"].rsplit(":", 1)[1]
    assert scraped == {f"collector-a:{listen_port}", f"collector-b:{listen_port}"}


def test_every_service_has_a_healthcheck_a_restart_policy_and_its_volumes():
    top = compose()
    for name, service in services().items():
        assert service.get("restart") in ("unless-stopped", "always"), name
        check = service.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), name
        for source, _ in bind_sources(service):
            if source.startswith("./"):
                assert (REPO / source).is_file(), (name, source)  # shipped in the repository
            elif source.startswith("${"):
                assert ENV_REF.match(source), (name, source)  # the operator's path
            else:
                assert source in top["volumes"], (name, source)  # a named volume
        for secret in service.get("secrets", []):
            assert secret in top["secrets"], (name, secret)


def _strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _strings(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _strings(v, f"{path}[{i}]")]
    return [(path, str(node))] if node is not None else []


def test_no_secret_is_written_in_the_files():
    # Every value under a secret-looking key is an environment reference (or a file path for
    # programs that read secrets from files), in the compose file and each file it mounts.
    docs = {"docker-compose.yml": compose(), "deploy/tritonwatch.yaml": tritonwatch_config()}
    for name in ("alertmanager.yml", "prometheus.yml"):
        docs[f"deploy/{name}"] = yaml.safe_load((REPO / "deploy" / name).read_text())
    for doc_name, doc in docs.items():
        for path, value in _strings(doc):
            key = path.rsplit(".", 1)[-1]
            # (a service's `secrets:` list names compose secrets, it holds no value)
            if SECRET_NAME.search(key) and not key.endswith("_file") and "[" not in key:
                assert ENV_REF.match(value), (doc_name, path)
            # a URL's password
            for url in re.findall(r"[a-z]+://[^\s\"']+", value):
                password = urlsplit(url).password
                assert password is None or ENV_REF.match(password), (doc_name, path)
    compose_secrets = compose()["secrets"]
    assert all(set(s) == {"environment"} for s in compose_secrets.values())
    receivers = docs["deploy/alertmanager.yml"]["receivers"]
    hooks = [h for r in receivers for h in r.get("webhook_configs", [])]
    assert hooks and all("url" not in h and h["url_file"].startswith("/run/secrets/")
                         for h in hooks)


def _check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tritonwatch.cli", "check-config", "deploy/tritonwatch.yaml"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_mounted_config_passes_check_config_with_the_environment_set():
    base = {k: v for k, v in os.environ.items() if k not in ENV}
    done = _check_config({**base, **ENV})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stdout and "postgresql" in done.stdout
    # without it: one line naming the key and the variable, and never a value
    done = _check_config(base)
    assert done.returncode == 2
    assert "store.url" in done.stdout + done.stderr
    assert "POSTGRES_PASSWORD is not set" in done.stdout + done.stderr
