# Two entry points do all set-up on a fresh Debian machine (run as root, or with sudo rights
# for apt-get):  `make demo` runs the main job, `make test` runs the whole test suite.
PYTHON ?= python3
VENV := .venv
TRITON_VENV := .venv-triton

.PHONY: demo test lint system-deps venv triton-venv clean

demo: venv triton-venv
	$(VENV)/bin/tritonwatch demo

test: system-deps venv triton-venv lint
	$(VENV)/bin/pytest

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy tritonwatch tests bench

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

# tritonserver (from nvidia-pytriton) needs numpy<2, the product needs numpy>=2: its own venv.
triton-venv: $(TRITON_VENV)/.installed
$(TRITON_VENV)/.installed:
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install -q nvidia-pytriton==0.7.0
	touch $@

# PostgreSQL, Alertmanager, Prometheus and VictoriaMetrics are real servers the tests start
# themselves; Chromium renders the dashboard and the weekly report in tests.
system-deps:
	@if [ ! -x /usr/lib/postgresql/15/bin/initdb ] || ! command -v prometheus-alertmanager >/dev/null || ! command -v chromium >/dev/null || ! command -v victoria-metrics >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			postgresql prometheus-alertmanager prometheus chromium victoria-metrics >/dev/null; \
	fi

clean:
	rm -rf $(VENV) $(TRITON_VENV) tritonwatch-data tritonwatch-demo .pytest_cache .mypy_cache .ruff_cache
