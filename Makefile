# proxymode: the stable interface. `make test` and `make demo` work on a fresh machine:
# they create the virtualenv, build (or reuse) the control-plane binaries, and run.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
SANDBOX ?= .sandbox
PYTEST_ARGS ?=
# The suite mostly waits on real clusters: workers side by side, each with its own sandbox,
# longest tests first (tests/schedule.py, docs/decisions/0040-parallel-suite.md).
# TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 5
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadgroup --durations=15
SCENARIO ?= migrate

.PHONY: help run crds venv binaries system-deps image sandbox sandbox-down sandbox-status demo lint test test-unit test-sandbox bench clean

help:
	@echo "make demo          bring up the sandbox and watch a full iptables -> nftables migration"
	@echo "                   (SCENARIO=rollback: slow-sync on a canary, rolled back automatically)"
	@echo "make run           run the operator against \$$KUBECONFIG"
	@echo "make test          lint, type-check and run the whole suite"
	@echo "make sandbox       start the sandbox and its operator (.sandbox/env has KUBECONFIG"
	@echo "                   and PATH); then kubectl apply -f examples/..."
	@echo "make sandbox-down  stop every sandbox process and remove its state"
	@echo "make bench         how the engine's look, status and queries grow to 5,000 nodes"
	@echo "make image         build the operator image with podman (no Docker, no registry) and"
	@echo "                   export it to dist/ as an OCI archive"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

binaries:
	@bash sandbox/build-binaries.sh >/dev/null

system-deps:
	@bash sandbox/install-system-deps.sh

# The operator image, built with podman (images/build.sh; docs/install.md, "The image").
image: system-deps
	@bash images/build.sh --archive dist/proxymode-operator-$$(sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml).oci.tar

sandbox: venv binaries system-deps
	$(PY) -m proxymode_sandbox --dir $(SANDBOX) up

sandbox-down: venv
	$(PY) -m proxymode_sandbox --dir $(SANDBOX) down

sandbox-status: venv
	$(PY) -m proxymode_sandbox --dir $(SANDBOX) status

demo: sandbox
	$(PY) -m proxymode_sandbox --dir $(SANDBOX) show
	$(PY) -m proxymode_sandbox --dir $(SANDBOX) demo --scenario $(SCENARIO)

# The sandbox runs an operator of its own (`make sandbox`); against the sandbox this one
# takes over, so it is stopped first (and says so).
run: venv
	@$(PY) -m proxymode_sandbox --dir $(SANDBOX) operator stop --for-kubeconfig "$$KUBECONFIG"
	$(VENV)/bin/proxymode-operator --liveness=http://127.0.0.1:8080/healthz

crds: venv
	$(PY) -m proxymode.api.crd > crds/proxymode.io_proxymodepolicies.yaml

lint: venv
	$(VENV)/bin/ruff check operator sandbox tests benchmarks
	$(VENV)/bin/ruff format --check operator sandbox tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: venv binaries system-deps lint
	$(PY) -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-sandbox: venv binaries system-deps
	$(PY) -m pytest $(PYTEST_PARALLEL) tests/sandbox $(PYTEST_ARGS)

bench: venv
	$(PY) -m benchmarks.engine_scale
	$(PY) -m benchmarks.wakeups $(BENCH_SANDBOX_ARGS)
	$(PY) -m benchmarks.walk $(BENCH_WALK_ARGS)

clean: sandbox-down
	rm -rf $(VENV) build dist *.egg-info
