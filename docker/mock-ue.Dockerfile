# The mock UE game (`uerl mock-ue`): what a dev cluster runs when simulator.kind
# is `mock`. Built (tag uerl/mock-ue:0.1.0) by `make images` (Docker) or
# `make images-local` (buildah, no Docker engine) through tests/k8s/images/build.py.
# Only the `mock` extra is installed (no Ray, no torch).
#
# Build args:
#   BASE_IMAGE  a Debian bookworm image with Python 3.11: python:3.11-slim by default;
#               without a registry, build.py passes its debootstrap base.
#   PIP_CERT    optional: a CA bundle pip trusts during the build; never kept.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

ARG PIP_CERT
# A venv: Debian's own Python refuses system-wide pip installs (PEP 668).
RUN python3 -m venv /opt/venv \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin mockue
WORKDIR /opt/uerl
# The `mock` extra (the protocol and gymnasium; no Ray, no torch), from pyproject.toml
# alone (empty packages and README stand in for the sources): a source change
# reinstalls uerl only.
COPY pyproject.toml ./
RUN mkdir infra training && touch README.md infra/__init__.py training/__init__.py \
    && pip install ".[mock]" && rm -rf README.md infra training build *.egg-info
COPY README.md ./
COPY training ./training
COPY infra ./infra
RUN pip install --no-deps --force-reinstall . && rm -rf build *.egg-info

USER 10001
EXPOSE 50051
# Kubernetes probes can use the standard gRPC health service (grpc: port: 50051).
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s CMD python -c "import grpc, sys; \
from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; \
sys.exit(g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=3).status != h.HealthCheckResponse.SERVING)"
# SIGTERM stops the server cleanly (exit 0).
STOPSIGNAL SIGTERM
CMD ["uerl", "mock-ue", "--host", "0.0.0.0", "--port", "50051"]
