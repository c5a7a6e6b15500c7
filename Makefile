# Two entry points: `make local` (the main job) and `make test`.
# Both build the virtualenv first; `make setup` alone only builds it.
# `make e2e`: the real Kubernetes tier (builds its Go binaries once, ~35 min cold).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.uerl-installed

.PHONY: setup local test test-slow lint bench render images clean

setup: $(STAMP)

# torch first, pinned: the PyPI build (with its CUDA libraries, a few GB);
# the rest then resolves against it instead of pulling another torch.
$(STAMP): pyproject.toml
	@echo "setup 1/4: virtualenv $(VENV) ($(PYTHON))"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "setup 2/4: pip"
	@$(BIN)/python -m pip install -q --upgrade pip
	@echo "setup 3/4: torch 2.13.0 (the PyPI build with its CUDA libraries: a few GB, first run only)"
	@$(BIN)/python -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
		&& echo "  already installed" \
		|| $(BIN)/python -m pip install --progress-bar on torch==2.13.0
	@echo "setup 4/4: uerl and its dependencies (Ray, RLlib, Pulumi SDKs, test tools)"
	@# setuptools' "Editable installation" banner is advice for src-less layouts, not a problem.
	@PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e '.[infra,train,dev]'
	@touch $(STAMP)
	@echo "setup done: $(BIN)/uerl"

local: $(STAMP)
	$(BIN)/uerl local $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# Serial by default: measured here, `PYTEST_XDIST="-n 2 --dist loadgroup
# --no-loadscope-reorder"` took longer (27:41 for 513 tests on an otherwise idle 2-core
# machine: two Ray clusters at once only contend for the cores; three overloaded them
# so that nodes missed Ray's 30 s start limit). tests/conftest.py keeps such runs correct
# (module fixtures on one worker, the process-leak check per worker).
PYTEST_XDIST ?=

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -ra --durations=15 -m "not k8s and not slow" $(PYTEST_XDIST) $(PYTEST_ARGS)

# The long end-to-end training runs (game faults, learning, Ray Jobs, resume, both
# patterns, signals): CI runs them after `make test`.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -ra --durations=15 -m "slow and not k8s" $(PYTEST_XDIST) $(PYTEST_ARGS)

# Builds what is missing (cached outside the work tree), then runs the tier.
e2e: $(STAMP)
	bash tests/k8s/build/build.sh
	$(BIN)/python -m pytest -ra --durations=15 -m k8s tests/k8s $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/uerl bench $(ARGS)

render: $(STAMP)
	$(BIN)/uerl render --stack dev $(ARGS)

# The two images a dev cluster runs (Ray head/learners/workers, and the mock
# game), tagged as the topology's defaults say: infra/topology.py is the one
# place the tags are written. Load them into the cluster afterwards (README).
RAY_IMAGE = $(shell $(BIN)/python -c 'from infra.topology import Topology; print(Topology().ray.image_ref)')
MOCK_IMAGE = $(shell $(BIN)/python -c 'from infra.topology import SIMULATOR_DEFAULTS as d; print(d["mock"]["image"])')
DOCKER ?= docker

images: $(STAMP)
	$(DOCKER) build -f docker/ray.Dockerfile -t $(RAY_IMAGE) .
	$(DOCKER) build -f docker/mock-ue.Dockerfile -t $(MOCK_IMAGE) .

clean:
	rm -rf $(VENV) build *.egg-info
