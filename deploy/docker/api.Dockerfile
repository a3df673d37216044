# syntax=docker/dockerfile:1
# api_service: REST under /api/v1, MCP at /mcp, /healthz, /readyz, /metrics on port 8080.
# The image also carries `memctl` (migrations, organizations, keys).
# Build from the repository root:
#   docker build -f deploy/docker/api.Dockerfile -t memory-api:0.1.0 .
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
RUN pip install ".[api]"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 memory \
 && useradd --system --uid 10001 --gid memory --no-create-home --home-dir /nonexistent memory
COPY --from=build /opt/venv /opt/venv
COPY deploy/healthcheck.py /opt/memory/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MEMORY_HOST=0.0.0.0 \
    MEMORY_PORT=8080 \
    MEMORY_DATA_DIR=/tmp/memory
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "/opt/memory/healthcheck.py", "http", "http://127.0.0.1:8080/healthz"]
CMD ["python", "-m", "api_service"]
