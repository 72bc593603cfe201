# syntax=docker/dockerfile:1
# The serving image: onnxruntime and NumPy, no torch, and the default models committed in models/.
# `bash scripts/build-image.sh` builds it with docker, or with podman and no registry (a Debian base built from
# Debian's packages, passed as BASE); `docker build -t normserve:latest .` works where python:3.11-slim pulls.
# Either base is Debian bookworm with Python 3.11.
ARG BASE=python:3.11-slim

# ---- build: a venv of the pinned dependencies and the project ----
FROM ${BASE} AS build
# An imported base has no config at all: no PATH.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python3 -m venv /opt/venv
# Dependencies first: a code change does not reinstall them. requirements-serve.txt is the whole closure of
# pyproject.toml's dependencies, pinned; nothing else is resolved here.
COPY requirements-serve.txt ./
RUN /opt/venv/bin/pip install --no-deps -r requirements-serve.txt
COPY pyproject.toml README.md ./
COPY app ./app
# `pip check` fails the build when pyproject.toml needs a package, or a version, that requirements-serve.txt does
# not pin: the image and the serving install cannot drift. Then what never runs here goes: pip and setuptools
# (nothing installs at run time) and the packages' own test suites (about 20 MB).
RUN /opt/venv/bin/pip install --no-deps . \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/python -m pip uninstall -y -q pip setuptools \
    && find /opt/venv -depth -type d -path '*/site-packages/*/tests' -exec rm -rf {} +

# ---- runtime: the venv, the models, a non-root user ----
FROM ${BASE} AS runtime
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NORMSERVE_MODEL_DIR=/srv/models NORMSERVE_HOST=0.0.0.0 NORMSERVE_PORT=8000 NORMSERVE_GRPC_PORT=8001
# python:3.11-slim's own pip is of no use at run time (the Debian base has none).
RUN groupadd --system --gid 10001 normserve \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent normserve \
    && (python3 -m pip uninstall -y -q pip setuptools wheel 2>/dev/null || true)
COPY --from=build /opt/venv /opt/venv
COPY models /srv/models
WORKDIR /srv
USER 10001
# HTTP (REST and the Open Inference Protocol), and the Open Inference Protocol over gRPC.
EXPOSE 8000 8001
# Run it with a read-only root and an in-memory /tmp (docker-compose.yml, deploy/k8s/):
#   docker run --read-only --tmpfs /tmp -p 8000:8000 -p 8001:8001 normserve:latest
# There is no curl: the probe is Python's own urllib, on the port the server listens on.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os,sys,urllib.request as u; p=os.environ.get('NORMSERVE_PORT','8000'); sys.exit(u.urlopen(f'http://127.0.0.1:{p}/v2/health/ready', timeout=2).status != 200)"]
CMD ["normserve", "serve"]
