# Two entry points: `make local` (the main job) and `make test`.
# Both build the virtualenv first; `make setup` alone only builds it.
# `make e2e`: the real Kubernetes tier (builds its Go binaries once, ~35 min cold).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.uerl-installed

.PHONY: setup local test lint bench render images clean

setup: $(STAMP)

# torch first, pinned: the PyPI build (with its CUDA libraries, a few GB);
# the rest then resolves against it instead of pulling another torch.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[infra,train,dev]'
	touch $(STAMP)

local: $(STAMP)
	$(BIN)/uerl local $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -ra -m "not k8s" $(PYTEST_ARGS)

# Builds what is missing (cached outside the work tree), then runs the tier.
e2e: $(STAMP)
	bash tests/k8s/build/build.sh
	$(BIN)/python -m pytest -ra -m k8s tests/k8s $(PYTEST_ARGS)

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
