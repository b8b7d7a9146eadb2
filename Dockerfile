# syntax=docker/dockerfile:1
#
# nri-midbatch container image.
#
#   docker build -t ghcr.io/example/nri-midbatch:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... --push .
#
# Two stages on the same slim Python base: the first builds wheels (the project and
# every runtime dependency), the second installs only those wheels. The final image
# holds no source tree, no build tools, no pip cache and no pip.
# Needs BuildKit (the default builder since Docker 23; buildah and podman support it
# too) for the RUN --mount in the final stage.

# One tag for both stages; bump it here (or with --build-arg) to move the base image.
ARG PYTHON_IMAGE=python:3.12.11-slim-bookworm

# --------------------------------------------------------------------------- build
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# Only what the wheel is built from; .dockerignore keeps the rest of the checkout out.
COPY pyproject.toml README.md ./
COPY nri_midbatch/ ./nri_midbatch/

# The project wheel (pure Python, built with setuptools from pyproject.toml), then
# wheels of its runtime dependencies resolved from that wheel's metadata. The
# dependencies must come as binary wheels: nothing is compiled, so the image needs
# no compiler on any architecture that PyPI has wheels for (amd64, arm64).
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && pip wheel --no-cache-dir --only-binary=:all: --wheel-dir /wheels /wheels/nri_midbatch-*.whl

# --------------------------------------------------------------------------- final
FROM ${PYTHON_IMAGE}

ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="nri-midbatch" \
      org.opencontainers.image.description="NRI plugin that sets cgroup values for Koordinator batch and mid-tier pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/example/nri-midbatch" \
      org.opencontainers.image.documentation="https://github.com/example/nri-midbatch/blob/main/docs/install.md"

# Install the wheels straight from the build stage through a bind mount, so they never
# become a layer of this image; --no-index: nothing is fetched here. Then remove pip
# itself: nothing installs anything at run time.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/*.whl \
    && pip uninstall --yes pip

# Unbuffered logs; no .pyc writes at run time (the DaemonSet's root filesystem is
# read-only, and pip compiled the installed modules above).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# Root, on purpose: the runtime creates the NRI socket directory (/var/run/nri) with
# mode 0700, so only root can reach the socket, and the plugin writes pod-level cgroup
# files owned by root. The DaemonSet drops every capability and forbids privilege
# escalation; root is the only thing this image asks for. See docs/install.md.
# hadolint ignore=DL3002
USER 0:0

# Exec form, no shell: the process is PID 1 and gets SIGTERM from the kubelet directly.
# ENTRYPOINT is the program; CMD its default arguments, replaced by the DaemonSet's args.
ENTRYPOINT ["/usr/local/bin/nri-midbatch"]
CMD ["run"]
