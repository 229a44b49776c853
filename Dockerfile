# syntax=docker/dockerfile:1
# ipam-bridge manager image: `docker build -t IMG .` (or `make image`).
# Two stages: the builder makes a virtualenv with the operator's dependencies only (no test,
# lint or demo extras), pinned by constraints.txt, and the operator's distribution only
# (`bridge` and `backends`; the sandbox, sandbox/ with the mock_* packages, is a distribution of
# its own and is neither copied nor installed); the runtime
# stage copies that virtualenv onto a clean python:3.11-slim and runs as a numeric non-root
# user. Nothing is written outside /tmp at run time, so the container works with a read-only
# root filesystem.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when these files change.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; \
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
open('/tmp/requirements.txt', 'w').write('\n'.join(deps) + '\n')" \
 && pip install -c constraints.txt -r /tmp/requirements.txt
# Then the operator itself (no extras; README.md is optional for the build). The last line
# checks that no sandbox package is importable and that the sandbox's console script
# `mock-phpipam` is not installed.
COPY README.md* ./
COPY backends ./backends
COPY bridge ./bridge
# bridge/crds links to crds/: the CRDs are package data.
COPY crds ./crds
RUN pip install --no-deps . \
 && python -m compileall -q /opt/venv \
 && ipam-bridge --help > /dev/null \
 && python -c "import importlib.util as u, shutil, sys; \
sys.exit(any(u.find_spec(m) for m in ('mock_kubernetes', 'mock_phpipam', 'mock_infoblox')) \
    or shutil.which('mock-phpipam') is not None)"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="ipam-bridge" \
      org.opencontainers.image.description="Cluster API IPAM provider backed by phpIPAM and Infoblox NIOS" \
      org.opencontainers.image.source="https://github.com/ipam-bridge/ipam-bridge" \
      org.opencontainers.image.licenses="Apache-2.0"
# A passwd entry for the numeric user (Python's getpass and some libraries look it up).
RUN groupadd --system --gid 65532 ipam-bridge \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin ipam-bridge
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 65532:65532
# 8080: Prometheus /metrics (IPAM_BRIDGE_METRICS_PORT); 8081: kopf liveness /healthz
# (IPAM_BRIDGE_HEALTH_PORT).
EXPOSE 8080 8081
ENTRYPOINT ["ipam-bridge", "run"]
