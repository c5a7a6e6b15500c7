# uerl's Ray image: the head, learner and worker pods run it, and every env
# runner imports uerl from it. The topology's default `ray.image` is
# uerl/ray:<ray version>-py311-cpu; build from the repository root:
#   docker build -f docker/ray.Dockerfile -t uerl/ray:2.60.0-py311-cpu .
# Keep RAY_VERSION equal to infra.topology.RAY_VERSION and the pyproject pin
# (tests/test_ray_image.py checks both).
ARG RAY_VERSION=2.60.0

# The compiled game client (native/), built on the same base as the image that runs it
# (same glibc, same Python); only its wheel is carried over.
FROM rayproject/ray:${RAY_VERSION}-py311-cpu AS native
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal \
    && pip install --no-cache-dir "maturin>=1.8,<2"
COPY --chown=ray:users protos /home/ray/src/protos
COPY --chown=ray:users native /home/ray/src/native
RUN cd /home/ray/src/native && PATH="$HOME/.cargo/bin:$PATH" \
    maturin build --release --interpreter python -o /home/ray/wheels

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
COPY --from=native /home/ray/wheels /tmp/uerl-native
RUN pip install --no-cache-dir /tmp/uerl-native/*.whl && rm -rf /tmp/uerl-native

WORKDIR /home/ray
# The base image's entrypoint and user are kept: KubeRay runs `ray start` in it.
