# Set-up and checks. Every target installs what it needs into .venv from the lock.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha1sum | cut -c1-12)
DEMO_RUN ?= demo_run
DEMO_BIG_RUN ?= demo_big_run
PORT ?= 8888
UV_VERSION := 0.13.8
LOCK_DATE := 2026-12-02
TOOLS := .tools
UV := $(TOOLS)/bin/uv

.PHONY: install lock chromium strace lint check test docs bench wheels mutants campaigns preemption-campaign race-campaign run-campaign two-tier-campaign pod-campaign demo demo-data big-run screenshot clean

# uv installs the lock (hashes checked) in seconds where pip takes over a minute; the
# venv itself is a plain one, with pip, for whoever works in it.
$(STAMP): requirements.lock pyproject.toml | $(UV)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(UV) pip install --quiet --python $(PY) -r requirements.lock
	$(UV) pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# requirements.lock is generated from pyproject.toml, never edited by hand: the runtime
# dependencies, the gcs, explore, widgets and docs extras and the test group (which includes the
# demo group), with hashes. Binder's binder/requirements.txt is the runtime, widgets and
# demo part of it, pinned to the same versions. uv resolves as of LOCK_DATE, so the same
# pyproject.toml gives the same lock on any day.
LOCK_FLAGS := --generate-hashes --python-version 3.11 --exclude-newer $(LOCK_DATE) \
	--custom-compile-command "make lock" --quiet

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

lock: $(UV)
	$(UV) pip compile pyproject.toml --extra gcs --extra explore --extra widgets --extra docs --group test \
		$(LOCK_FLAGS) -o requirements.lock
	$(UV) pip compile pyproject.toml --extra widgets --group demo \
		--constraint requirements.lock $(LOCK_FLAGS) -o binder/requirements.txt

# The browser test drives Debian's Chromium; install it when it is missing.
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
		echo "installing chromium"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; \
	fi
	@chromium --version

# The syscall count (tests/test_syscalls.py) traces reads with Debian's strace; install
# it when it is missing.
strace:
	@if ! command -v strace >/dev/null 2>&1; then \
		echo "installing strace"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq strace >/dev/null; \
	fi
	@strace -V | head -1

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Test processes (pytest-xdist): one per core of the 2-core machines the suite is sized
# for. Every test makes its own directories and servers; the demo run is shared
# (tests/conftest.py). Each test file runs in one process (loadscope), so a file's
# module fixtures (a two-process JAX job, a saved run) are made once, not per process.
# Files are handed out in collection order (no reordering by test count), which
# tests/conftest.py starts with the longest files. `make test WORKERS=auto` uses every core.
WORKERS ?= 2
PYTEST := $(PY) -m pytest -p no:cacheprovider -n $(WORKERS) --dist loadscope --no-loadscope-reorder

# The quick loop (under 2 minutes): lint, types, and the tests marked neither slow nor
# browser (tests/conftest.py says which those are).
check: lint
	$(PYTEST) -q -m "not slow and not browser"

# Everything, with the 25 slowest tests listed at the end.
test: install chromium strace lint
	$(PYTEST) -ra --durations=25

bench: install
	$(PY) bench/save_load.py
	$(PY) bench/explore.py
	$(PY) bench/explorer_scale.py
	$(PY) bench/export.py
	$(PY) bench/reads.py
	$(PY) bench/run_timeline.py
	$(PY) bench/surgery.py

# The wheels bench/accelerator.py needs on a machine with no package registry (a TPU
# VM): tinax's runtime, explore extra, flax and optax, pinned to the lock, for CPython
# 3.11 on manylinux x86-64, into the git-ignored .whl-tpu/. JAX, jaxlib, libtpu, NumPy
# and SciPy are left out: the machine's own stay first (README, "On an accelerator").
WHEELS_DIR := .whl-tpu
WHEELS_SKIP := jax|jaxlib|libtpu|numpy|scipy
wheels: install
	rm -rf $(WHEELS_DIR) && mkdir -p $(WHEELS_DIR)
	printf 'flax\noptax\n' > $(WHEELS_DIR)/extra.in
	$(UV) pip compile pyproject.toml $(WHEELS_DIR)/extra.in --constraint requirements.lock \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-header --no-annotate --quiet \
		| grep -Ev '^($(WHEELS_SKIP))==' > $(WHEELS_DIR)/requirements.txt
	$(PY) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--python-version 3.11 --implementation cp --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
		-d $(WHEELS_DIR) -r $(WHEELS_DIR)/requirements.txt
	@du -sh $(WHEELS_DIR)

# Saves against the real world, tinax beside Orbax alone (a few minutes each; `make test`
# runs a small sample): jobs SIGKILLed mid-save then resumed, and two writers racing
# for one checkpoint, and a training run (saving and pruning) SIGKILLed at random
# moments then resumed. Each exits non-zero when tinax misses a goal.
campaigns: preemption-campaign race-campaign run-campaign two-tier-campaign pod-campaign

preemption-campaign: install
	$(PY) bench/preemption.py --kills 30 --mib 256
	$(PY) bench/preemption.py --kills 30 --mib 256 --sides tinax --write-batch-mib 64

race-campaign: install
	$(PY) bench/racing_writers.py --trials 50 --mib 128

run-campaign: install
	$(PY) bench/run_campaign.py --kills 30 --mib 32

# A run with a local tier and a gs:// one (the emulator at 30 ms a request), killed 100
# times, half of them within a promotion; then 40 two-tier jobs sent SIGTERM at random
# moments (half on gs://, half with DEBUG logging), each preemption step checked durable.
two-tier-campaign: install
	$(PY) bench/two_tier_campaign.py --kills 100 --mib 8
	$(PY) bench/two_tier_sigterm.py --trials 40 --mib 4

# A job of two processes, each with a local directory of its own (the hosts of a pod
# slice), killed 50 times at random moments (one process or all; between saves or in a
# promotion), each kill followed by a resume checked bit for bit.
pod-campaign: install
	$(PY) bench/pod_campaign.py --kills 50

# The whole mutant campaign (tests/mutants.py): hundreds of damaged and hostile
# checkpoints against every read path; make test runs a sample of it.
mutants: install
	$(PY) tests/mutants.py

demo-data: install big-run
	$(PY) demo/make_run.py $(DEMO_RUN)

# The many-leaf run with a planted jump and NaN (notebook 06, the run timeline).
big-run: install
	$(PY) demo/make_big_run.py $(DEMO_BIG_RUN)

# The README's picture: the explorer on the many-leaf demo run, in JupyterLab in
# Chromium. Commit docs/explorer.png when it changes; the tests never write it.
screenshot: demo-data chromium
	$(PY) demo/screenshot.py $(DEMO_BIG_RUN) docs/explorer.png

# JupyterLab on notebooks/ at the printed URL: no token, loopback only, and no silent
# move to another port (the URL would be wrong). Jupyter refuses root unless told.
# demo/jupyter_server_config.py keeps opened notebooks byte-identical to git.
demo: demo-data
	@echo "JupyterLab: http://127.0.0.1:$(PORT)/lab (token disabled, listening on 127.0.0.1 only)"
	$(VENV)/bin/jupyter lab --no-browser --ip=127.0.0.1 --port=$(PORT) --ServerApp.port_retries=0 \
		--IdentityProvider.token= --ServerApp.root_dir=notebooks --config=demo/jupyter_server_config.py \
		$$( [ "$$(id -u)" = 0 ] && echo --allow-root )

clean:
	rm -rf $(VENV) $(TOOLS) $(DEMO_RUN) docs/_build docs/api/generated .pytest_cache .mypy_cache .ruff_cache

# The documentation site, from docs/ into docs/_build/html: warnings are errors (every
# one listed), references nitpicky, every notebook executed (on the demo runs, made
# first), then every internal link of the built pages checked (docs/_ext/check_links.py;
# links out of the site are not followed). A first build downloads the scripts that draw
# the tutorials' widgets from the npm registry, pinned and checksummed, into a cache
# (docs/_ext/widget_assets.py); later builds need no network.
DOCS_OUT := docs/_build/html
docs: install demo-data
	rm -rf docs/api/generated $(DOCS_OUT)
	$(VENV)/bin/sphinx-build -W --keep-going -n -q -b html docs $(DOCS_OUT)
	$(PY) docs/_ext/check_links.py $(DOCS_OUT)
	@echo "the site: $(DOCS_OUT)/index.html"
