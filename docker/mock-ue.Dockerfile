# The mock UE game (`uerl mock-ue`): what a dev cluster runs when simulator.kind
# is `mock`. Build from the repository root:
#   docker build -f docker/mock-ue.Dockerfile -t uerl/mock-ue:0.1.0 .
# Only the mock's own dependencies are installed (no Ray, no torch): the mock
# imports grpc, protobuf, gymnasium, numpy and pydantic, nothing else.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Keep these ranges equal to pyproject's (train extra + base dependencies).
RUN pip install \
        "grpcio>=1.81.1,<2" \
        "grpcio-health-checking>=1.81,<2" \
        "protobuf>=6.33.5,<7" \
        "gymnasium>=1.0,<1.3" \
        "numpy>=1.26" \
        "pydantic>=2.7,<3" \
        "pyyaml>=6"

WORKDIR /opt/uerl
COPY pyproject.toml README.md ./
COPY training ./training
COPY infra ./infra
# --no-deps: the base install is above; the train extra (Ray, torch) is not needed.
RUN pip install --no-deps . \
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
