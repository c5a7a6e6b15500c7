# uerl's Ray image: the head, learner and worker pods run it, and every env
# runner imports uerl from it. The topology's default `ray.image` is
# uerl/ray:<ray version>-py311-cpu. Build it with `make images` (Docker) or
# `make images-local` (buildah, no Docker engine): both run tests/k8s/images/build.py,
# which stages the build context outside the work tree: the sources below, plus
# `native-wheels/` (the compiled game client, built on the host by cargo + maturin) and
# `torch-cuda-stubs/` (see TORCH_CUDA; empty for `pypi`).
#
# Build args:
#   BASE_IMAGE     a Debian bookworm image with Python 3.11 (`python3 -m venv` works):
#                  python:3.11-slim by default; without a registry, build.py passes its
#                  debootstrap base (docker-archive:...).
#   RAY_VERSION    keep equal to infra.topology.RAY_VERSION and the pyproject pin
#                  (tests/test_ray_image.py checks both); TORCH_VERSION likewise.
#   TORCH_CUDA     `pypi` (default): torch as PyPI ships it, with its CUDA wheels (~3.4 GB
#                  more). `stub`: torch without them, plus the stub CUDA libraries of
#                  context dir `torch-cuda-stubs/` (tests/k8s/images/cuda_stubs.py: the
#                  sonames PyPI's torch links, each symbol returning an error, so torch
#                  runs on CPU and sees no GPU); build.py passes `stub`.
#   PIP_CERT       optional: a CA bundle pip trusts during the build (a build-time mount
#                  behind a TLS-inspecting proxy); never written into the image.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG RAY_VERSION=2.60.0
ARG TORCH_VERSION=2.13.0

# RAY_USAGE_STATS_ENABLED=0: pods must not phone home (the test node drops it anyway).
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_USAGE_STATS_ENABLED=0

# KubeRay expects uid 1000 named `ray` with home /home/ray. Its start command is a login
# shell (`bash -lc`), and Debian's /etc/profile resets PATH: profile.d puts the venv back.
# ps and wget: what KubeRay's older probes and debugging use (the slim base lacks them).
RUN if ! command -v ps >/dev/null || ! command -v wget >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends procps wget \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --uid 1000 --gid users --create-home --home-dir /home/ray --shell /bin/bash ray \
    && python3 -m venv /opt/venv \
    && echo 'PATH=/opt/venv/bin:$PATH; export PATH' > /etc/profile.d/uerl-venv.sh

ARG PIP_CERT
ARG TORCH_CUDA=pypi
# torch first, pinned, so uerl's `torch>=2.5` resolves against it; its own layer, so a
# change to uerl's sources does not download it again. `stub`: its CUDA requirements are
# dropped from its installed metadata too, or the next install would fetch them.
COPY torch-cuda-stubs /tmp/torch-cuda-stubs
RUN --mount=type=cache,id=uerl-pip,target=/root/.cache/pip \
    if [ "$TORCH_CUDA" = stub ]; then \
        pip install --no-deps "torch==${TORCH_VERSION}" \
        && site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
        && sed -i -E '/^Requires-Dist: (cuda-|nvidia-|triton)/d' "$site"/torch-*.dist-info/METADATA \
        && cp -a /tmp/torch-cuda-stubs/lib*.so* "$site/torch/lib/"; \
    else \
        pip install "torch==${TORCH_VERSION}"; \
    fi \
    && rm -rf /tmp/torch-cuda-stubs

WORKDIR /opt/uerl
# Dependencies first, from pyproject.toml alone (empty packages and README stand in for
# the sources): a change to infra/, training/ or README then reinstalls uerl only.
COPY pyproject.toml ./
RUN --mount=type=cache,id=uerl-pip,target=/root/.cache/pip \
    mkdir infra training && touch README.md infra/__init__.py training/__init__.py \
    && pip install ".[train]" "ray[default,rllib]==${RAY_VERSION}" \
    && rm -rf README.md infra training build *.egg-info
COPY README.md ./
COPY infra ./infra
COPY training ./training
# Not editable: the image must not depend on this directory staying writable.
RUN pip install --no-cache-dir --no-deps --force-reinstall . && rm -rf build *.egg-info

# The compiled game client (native/), a wheel built on the host for this Python
# (no Rust toolchain in the image).
COPY native-wheels /tmp/uerl-native
RUN pip install --no-cache-dir --no-deps /tmp/uerl-native/*.whl && rm -rf /tmp/uerl-native

USER ray
WORKDIR /home/ray
# KubeRay replaces the command with its own `ray start`.
CMD ["bash"]
