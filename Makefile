# Two entry points: `make local` (the main job) and `make test`.
# Both build the virtualenv first; `make setup` alone only builds it.
# `make e2e`: the real Kubernetes tier (builds its Go binaries once, ~35 min cold; as root,
# the Debian packages of its real node and the images its pods run, cached outside the tree).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.uerl-installed
NATIVE_STAMP := $(VENV)/.uerl-native-installed
# The compiled game client's sources: rebuilt when they (or the protocol) change.
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock native/build.rs native/pyproject.toml \
	$(wildcard native/src/*.rs) protos/schola/schola_gym.proto
# Cargo's build cache, outside the work tree: a rebuild after a change takes seconds.
CARGO_TARGET_DIR ?= $(HOME)/.cache/uerl-native/target

.PHONY: setup local test test-slow e2e e2e-long lint bench bench-policies bench-self-play render images images-local docs clean

setup: $(STAMP) $(NATIVE_STAMP)

# torch first, pinned: the PyPI build (with its CUDA libraries, a few GB);
# the rest then resolves against it instead of pulling another torch.
$(STAMP): pyproject.toml
	@echo "setup 1/5: virtualenv $(VENV) ($(PYTHON))"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "setup 2/5: pip"
	@$(BIN)/python -m pip install -q --upgrade pip
	@echo "setup 3/5: torch 2.13.0 (the PyPI build with its CUDA libraries: a few GB, first run only)"
	@$(BIN)/python -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
		&& echo "  already installed" \
		|| $(BIN)/python -m pip install --progress-bar on torch==2.13.0
	@echo "setup 4/5: uerl and its dependencies (Ray, RLlib, Pulumi SDKs, test tools)"
	@# setuptools' "Editable installation" banner is advice for src-less layouts, not a problem.
	@PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e '.[infra,train,dev]'
	@touch $(STAMP)

# The compiled game client (native/: Rust, built by maturin into the virtualenv). Without
# cargo, uerl runs everything on its pure-Python client (docs/performance.md).
$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	@if command -v cargo >/dev/null 2>&1; then \
		echo "setup 5/5: compiled game client (native/, cargo build --release, about a minute the first time)"; \
		CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) $(BIN)/python -m pip install -q ./native; \
	else \
		echo "setup 5/5: no cargo on this machine: the pure-Python game client is used"; \
	fi
	@touch $(NATIVE_STAMP)
	@echo "setup done: $(BIN)/uerl"

local: setup
	$(BIN)/uerl local $(ARGS)

# The docs site (MkDocs, Material), strict: a broken link or a missing page fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# `make test` runs on two pytest-xdist workers (`--dist loadfile`: tests/conftest.py
# keeps a module on one worker and checks for leaked processes per worker);
# measured on this 2-core machine, 1,134 tests: 7:05 serial (the CPU 45 % busy), 3:47 on
# two workers a module at a time (4:57 when xdist spread single tests and a module's
# fixtures were set up on both workers). `make test-slow` stays serial: each of its tests runs a Ray cluster
# and games, and two at once only contend for the cores (27:41 for 513 tests, longer
# than serially, when it was measured); three overloaded them so that nodes missed Ray's
# 30 s start limit. `PYTEST_XDIST=` runs `make test` serially.
PYTEST_XDIST ?= -n 2 --dist loadfile

test: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -ra --durations=15 -m "not k8s and not slow" $(PYTEST_XDIST) $(PYTEST_ARGS)

# The long end-to-end training runs (game faults, learning, Ray Jobs, resume, both
# patterns, signals): CI runs them after `make test`. The metrics run's Prometheus is
# Debian's package, fetched on first use by tests/tools/prometheus.sh (apt-get download,
# never installed) into ~/.cache/uerl-prometheus; `make test` parses the dashboard's
# queries with its promtool.
test-slow: setup
	$(BIN)/python -m pytest -ra --durations=15 -m "slow and not k8s" $(PYTEST_ARGS)

# Builds what is missing (cached outside the work tree), then runs the tier on two
# workers: the real node's modules (one node at a time: ONE_UNIT in tests/conftest.py) on
# one, the control-plane modules (each its own API server, kine and KWOK on free ports) on
# the other. Serially the tier kept the CPU about half busy (it waits on pods, Ray and the
# API server): 18 min serially, 11:30 on two workers. `E2E_XDIST=` runs it serially.
# `--no-loadscope-reorder`: the order of LONGEST_FIRST (tests/conftest.py), not xdist's
# by number of tests, so the modules whose pieces a cold build makes first start first.
E2E_XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder
# `E2E_BUILD=` runs the tier without building first: CI builds in the background and the
# tier starts at once, each module waiting for its own pieces (tests/k8s/build_wait.py).
E2E_BUILD ?= 1

e2e: setup
ifneq ($(E2E_BUILD),)
	bash tests/k8s/build/build.sh
	bash tests/k8s/build/install-node-packages.sh
	$(BIN)/python tests/k8s/images/build.py
endif
	$(BIN)/python -m pytest -ra --durations=15 -m "k8s and not long" tests/k8s $(E2E_XDIST) $(PYTEST_ARGS)

# The second tier: the real-pods scenarios too long for the gate (marked `long`), not in
# .ci/run. Run it before resolving an issue that touches what they prove, and record its
# last green run in docs/evidence.md. Serial: each is a real node's whole CPU.
e2e-long: setup
	bash tests/k8s/build/build.sh
	bash tests/k8s/build/install-node-packages.sh
	$(BIN)/python tests/k8s/images/build.py
	$(BIN)/python -m pytest -ra --durations=15 -m "k8s and long" tests/k8s $(PYTEST_ARGS)

# Benchmarks, on demand (not in CI; docs/development.md lists them): figures, not checks.
bench: setup
	$(BIN)/uerl bench $(ARGS)

# ctde against independent at the same step budget on the Relay game (docs/training.md).
bench-policies: setup
	$(BIN)/uerl bench-policies --env uerl/Relay-v0 --policies ctde independent --seeds 1 --iterations 25 $(ARGS)

# Self-play on Sumo as tests/test_self_play_e2e.py trains it, over five seeds: wins, draws
# and losses against a random player and the first snapshot (the test's thresholds).
bench-self-play: setup
	$(BIN)/uerl bench-self-play --seeds 1 2 3 4 5 $(ARGS)

render: setup
	$(BIN)/uerl render --stack dev $(ARGS)

# The images a dev cluster runs (Ray head/workers/CPU learners; the CUDA Ray image for
# GPU learners, `learners.image`; the mock game), tagged
# as the topology's defaults say (infra/topology/ is the one place the tags are
# written), from docker/*.Dockerfile. tests/k8s/images/build.py stages each build context
# (the Ray image's holds the compiled game client's wheel, built here by cargo + maturin).
# `images`: with a Docker engine; load them into the cluster afterwards (docs/kubernetes.md).
# `images-local`: no Docker engine, no registry (buildah, as root, on a debootstrap
# base; plus the KubeRay operator image the chart expects): docker-archives in
# $UERL_IMAGE_CACHE (default ~/.cache/uerl-images), rebuilt only when their inputs change.
DOCKER ?= docker

# IMAGES="ray mock-ue": without the CUDA image (a cluster with no GPU learners).
IMAGES ?= ray ray-cuda mock-ue

images: setup
	$(BIN)/python tests/k8s/images/build.py --engine docker --docker $(DOCKER) --only $(IMAGES)

images-local: setup
	$(BIN)/python tests/k8s/images/build.py $(IMAGES_ARGS)

clean:
	rm -rf $(VENV) build site *.egg-info
