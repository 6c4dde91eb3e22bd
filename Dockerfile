# llmserve: gRPC server for local GGUF models (CPU). llama-cpp-python compiles here.
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY service ./service
COPY client ./client
RUN pip install --no-cache-dir '.[server]' \
    && python -m llmserve.service.model_files
EXPOSE 50051
ENV LLMSERVE_HOST=0.0.0.0 LLMSERVE_PORT=50051
ENTRYPOINT ["llmserve", "serve"]
