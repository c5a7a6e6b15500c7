# uerl's Ray image: the head, learner and worker pods run it, and every env
# runner imports uerl from it. The topology's default `ray.image` is
# uerl/ray:<ray version>-py311-cpu; build from the repository root:
#   docker build -f docker/ray.Dockerfile -t uerl/ray:2.60.0-py311-cpu .
# Keep RAY_VERSION equal to infra.topology.RAY_VERSION and the pyproject pin
# (tests/test_ray_image.py checks both).
ARG RAY_VERSION=2.60.0
FROM rayproject/ray:${RAY_VERSION}-py311-cpu

# torch first, from the CPU index: the default index pulls a multi-GB CUDA build.
ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" \
        --index-url https://download.pytorch.org/whl/cpu

WORKDIR /opt/uerl
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users infra ./infra
COPY --chown=ray:users training ./training
# Not editable: the image must not depend on this directory staying writable.
RUN pip install --no-cache-dir ".[train]"

WORKDIR /home/ray
# The base image's entrypoint and user are kept: KubeRay runs `ray start` in it.
