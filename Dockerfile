# syntax=docker/dockerfile:1
# The proxymode operator image: a wheel built from this repository, installed with its
# dependencies into a virtualenv in a build stage, copied into a slim runtime stage that runs
# as a non-root UID. The chart's Deployment passes the arguments (--liveness, --peering).
#
#   docker build -t proxymode/proxymode-operator:0.1.0 .
#   make image     # the same with podman, without Docker or a registry (images/build.sh)
#
# tests/image/ builds it with podman and runs it under the chart's security context;
# tests/chart/test_image.py checks the build steps without a container engine.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The runtime stage's base: the same image unless told otherwise. images/build.sh passes one
# without pip or venv, made from the same Debian packages (docs/decisions/0060).
ARG RUNTIME_IMAGE=${PYTHON_IMAGE}

# ---- build: wheel + virtualenv ----------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore). setuptools finds packages under both
# source roots named in pyproject.toml, so the sandbox package's sources come along.
COPY pyproject.toml README.md ./
# The dependencies first, from pyproject.toml alone: a layer that a change to the operator's
# code does not invalidate.
RUN python -m venv /opt/proxymode \
 && python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" >/tmp/requirements.txt \
 && /opt/proxymode/bin/pip install --requirement /tmp/requirements.txt \
 && rm /tmp/requirements.txt
COPY operator/ operator/
COPY sandbox/proxymode_sandbox/ sandbox/proxymode_sandbox/
# Then the wheel (its dependencies are already there; `pip check` agrees). Left out of the
# virtualenv the runtime stage copies, because nothing imports them at run time:
#   pip, setuptools, wheel: nothing is installed into a running operator;
#   kubernetes/aio: the client's asyncio twin (about 68 MB), which neither proxymode nor kopf
#     imports (kopf talks to the API with aiohttp; tests/image/ proves the imports).
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/proxymode/bin/pip install /wheels/proxymode-*.whl \
 && /opt/proxymode/bin/pip check \
 && /opt/proxymode/bin/python -m pip uninstall --yes --quiet pip setuptools wheel \
 && rm -rf /opt/proxymode/lib/python3*/site-packages/kubernetes/aio \
 && /opt/proxymode/bin/proxymode-operator --help >/dev/null \
 && /opt/proxymode/bin/python -c "import proxymode.handlers"

# ---- runtime ----------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime
# The same path as in the build stage: a virtualenv's scripts name their interpreter by path.
COPY --from=build /opt/proxymode /opt/proxymode
# A named user for UID 10001 (kopf falls back to the user name when POD_ID is unset). The
# base's own pip goes too (python:3.11-slim has one; images/build.sh's base has none).
# The verification Job (`proxymode verify-node`, same image) reads the node's rules with
# iptables-save, nft and ip: installed here unless the base has them (images/build.sh's does).
# Unpinned on purpose (DL3008): the base's Debian suite decides the versions, as it does for
# every other package of the image.
# hadolint ignore=DL3008
RUN if python -m pip --version >/dev/null 2>&1; then \
      python -m pip uninstall --yes --quiet pip setuptools wheel; \
    fi \
 && if ! command -v nft >/dev/null || ! command -v iptables-save >/dev/null || ! command -v ip >/dev/null; then \
      apt-get update \
      && apt-get install --yes --no-install-recommends iptables nftables iproute2 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && groupadd --system --gid 10001 proxymode \
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
