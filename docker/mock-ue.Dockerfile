# The mock UE game (`uerl mock-ue`): what a dev cluster runs when simulator.kind
# is `mock`. Build from the repository root:
#   docker build -f docker/mock-ue.Dockerfile -t uerl/mock-ue:0.1.0 .
# Only the `mock` extra is installed (no Ray, no torch).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/uerl
COPY pyproject.toml README.md ./
COPY training ./training
COPY infra ./infra
# The `mock` extra: the protocol and gymnasium; no Ray, no torch.
RUN pip install ".[mock]" \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin mockue

USER 10001
EXPOSE 50051
# Kubernetes probes can use the standard gRPC health service (grpc: port: 50051).
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s CMD python -c "import grpc, sys; \
from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; \
sys.exit(g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=3).status != h.HealthCheckResponse.SERVING)"
# SIGTERM stops the server cleanly (exit 0).
STOPSIGNAL SIGTERM
CMD ["uerl", "mock-ue", "--host", "0.0.0.0", "--port", "50051"]
