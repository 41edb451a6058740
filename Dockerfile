# syntax=docker/dockerfile:1
# The proxymode operator image: a wheel built from this repository, installed with its
# dependencies into a virtualenv in a build stage, copied into a slim runtime stage that runs
# as a non-root UID. The chart's Deployment passes the arguments (--liveness, --peering).
#
#   docker build -t proxymode/proxymode-operator:0.1.0 .
#
# tests/chart/test_image.py checks these steps without a Docker engine: it builds the wheel the
# same way, installs it into a fresh virtualenv and runs the entrypoint as UID 10001.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: wheel + virtualenv ----------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore). setuptools finds packages under both
# source roots named in pyproject.toml, so the sandbox package's sources come along.
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY sandbox/proxymode_sandbox/ sandbox/proxymode_sandbox/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/proxymode \
 && /opt/proxymode/bin/pip install /wheels/proxymode-*.whl \
 && /opt/proxymode/bin/proxymode-operator --help >/dev/null

# ---- runtime ----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# The same path as in the build stage: a virtualenv's scripts name their interpreter by path.
COPY --from=build /opt/proxymode /opt/proxymode
# A named user for UID 10001 (kopf falls back to the user name when POD_ID is unset).
RUN groupadd --system --gid 10001 proxymode \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin proxymode
ENV PATH=/opt/proxymode/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp
LABEL org.opencontainers.image.title="proxymode-operator" \
      org.opencontainers.image.description="Migrates kube-proxy between iptables, ipvs and nftables, pool by pool" \
      org.opencontainers.image.licenses="Apache-2.0"
# Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["proxymode-operator"]
CMD ["--liveness=http://0.0.0.0:8080/healthz"]
