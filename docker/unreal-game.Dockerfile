# A packaged Linux UE build with the Schola plugin, as an image: what the games' pods run
# with `executables.in_image: true` and `simulator.image` set to it (no shared volume,
# no loader Job), or, built with an empty `game/`, the runtime a build on the shared volume
# runs in. Headless (the topology's default arguments: -nullrhi -unattended -nosplash
# -nosound), non-root (uid 1000, as `restricted` pods run a game), and with
# `schola-probe`, the gRPC probe of `simulator.probe: grpc` (docker/schola_probe.py).
#
#   mkdir -p ctx/game && cp -a path/to/Linux/. ctx/game/     # the folder holding Game.sh
#   cp docker/schola_probe.py ctx/
#   docker build -f docker/unreal-game.Dockerfile -t registry.example.com/games/my-game:1.0 ctx
#
# Build args:
#   BASE_IMAGE  the runtime: a glibc Linux with bash (every UE launcher is a bash script)
#               and Python 3 with venv (for the probe): ubuntu:22.04 by default, what
#               Epic builds Linux games against; the tier passes its own.
#   PIP_CERT    optional: a CA bundle pip trusts during the build; never kept.
ARG BASE_IMAGE=ubuntu:22.04
FROM ${BASE_IMAGE}

# A base that ends as a non-root user (a runtime image of one's own) still installs.
USER root
ARG PIP_CERT
RUN if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null \
        || ! command -v bash >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends bash ca-certificates python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/schola-probe \
    && /opt/schola-probe/bin/pip install --no-cache-dir --disable-pip-version-check \
        "grpcio>=1.81.1,<2" "grpcio-health-checking>=1.81,<2" \
    && (id -u 1000 >/dev/null 2>&1 || useradd --uid 1000 --gid users --no-create-home \
        --home-dir /tmp --shell /usr/sbin/nologin ue)
COPY schola_probe.py /opt/schola-probe/schola_probe.py
RUN printf '#!/bin/sh\nexec /opt/schola-probe/bin/python /opt/schola-probe/schola_probe.py "$@"\n' \
        > /usr/local/bin/schola-probe \
    && chmod 0755 /usr/local/bin/schola-probe

# The build, read-only to the game: the launcher, every *.sh and Binaries/Linux/
# executable (a zip made on Windows lost those bits), everything readable.
COPY game/ /opt/ue/
RUN chmod -R a+rX,go-w /opt/ue \
    && find /opt/ue \( -name '*.sh' -o -path '*/Binaries/Linux/*' \) -type f -exec chmod 0755 {} +

# UE writes its logs and saved state under the user's home: /tmp (an emptyDir in pods).
ENV HOME=/tmp
WORKDIR /opt/ue
USER 1000
EXPOSE 50051
STOPSIGNAL SIGTERM
# The topology gives the command (`simulator.command`, `simulator.args`); alone, the
# launcher with Schola's port and the headless flags.
CMD ["/opt/ue/Game.sh", "-ScholaPort=50051", "-nullrhi", "-unattended", "-nosplash", "-nosound"]
