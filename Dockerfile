# syntax=docker/dockerfile:1

# ---- export: a CPU-only torch turns the PyTorch models into ONNX files ----
FROM python:3.11-slim AS export
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The CPU wheel index: the default torch wheel pulls gigabytes of CUDA libraries.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY requirements-serve.txt ./
RUN pip install -r requirements-serve.txt "onnx>=1.16" "onnxscript>=0.1"
COPY pyproject.toml README.md ./
COPY app ./app
COPY scripts ./scripts
RUN pip install --no-deps . && python scripts/export_onnx.py --out-dir /models

# ---- runtime: onnxruntime and NumPy only, no torch, non-root ----
FROM python:3.11-slim AS runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NORMSERVE_MODEL_DIR=/srv/models NORMSERVE_HOST=0.0.0.0 NORMSERVE_PORT=8000 NORMSERVE_GRPC_PORT=8001
WORKDIR /srv
# Dependencies first: a code change does not reinstall them.
COPY requirements-serve.txt ./
RUN pip install -r requirements-serve.txt
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip install --no-deps . && useradd --system --uid 10001 --no-create-home normserve
COPY --from=export --chown=root:root /models ./models
USER 10001
# HTTP (REST and the Open Inference Protocol), and the Open Inference Protocol over gRPC.
EXPOSE 8000 8001
# Slim images have no curl: the probe is Python's own urllib.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status != 200)"]
CMD ["normserve", "serve"]
