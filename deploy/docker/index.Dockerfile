# syntax=docker/dockerfile:1
# index_service: one shard of per-organization FAISS indexes over gRPC on port 50061.
# CPU only: index_service runs its indexes on the CPU and refuses INDEX_DEVICE=cuda, so a
# CUDA variant would carry the CUDA libraries for nothing (see docs/operations.md).
# Build from the repository root:
#   docker build -f deploy/docker/index.Dockerfile -t memory-index:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api_service ./api_service
COPY embed_service ./embed_service
COPY index_service ./index_service
COPY memory_proto ./memory_proto
RUN pip install ".[index]"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 memory \
 && useradd --system --uid 10001 --gid memory --no-create-home --home-dir /nonexistent memory
COPY --from=build /opt/venv /opt/venv
COPY deploy/healthcheck.py /opt/memory/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    INDEX_HOST=0.0.0.0 \
    INDEX_PORT=50061
WORKDIR /tmp
USER 10001:10001
EXPOSE 50061
# Ready once the orgs this shard owns are loaded from PostgreSQL.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "/opt/memory/healthcheck.py", "index", "127.0.0.1:50061"]
CMD ["python", "-m", "index_service"]
