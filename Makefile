# Two commands on a fresh machine: `make run` starts a node on the embedded store; `make test` passes the suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

# Debian packages the tests drive as real peers (mosquitto_passwd, mosquitto_pub/sub, the reference broker,
# redis-server for the Redis store and redis-sentinel for its failover; tests start their own servers), Chromium
# and its driver for the dashboard's browser test, and promtool (Debian's prometheus) to check /metrics.
SYSTEM_TOOLS := /usr/sbin/mosquitto /usr/bin/mosquitto_passwd /usr/bin/mosquitto_pub /usr/bin/redis-server \
	/usr/bin/redis-cli /usr/bin/redis-sentinel /usr/bin/chromium /usr/bin/chromedriver /usr/bin/promtool

.PHONY: run test test-slow test-pure install dev system-deps java-deps lint typecheck bench bench-deps bench-backends clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The install compiles the hot path (setup.py, about a minute): it is redone only when what it builds from changed.
HOT_PATH := $(shell $(PY) -c "import sys; sys.path.insert(0, '.'); from tidewire.compiled import MODULES, \
	module_path; print(' '.join(module_path(m) for m in MODULES))")
BUILD_INPUTS := pyproject.toml setup.py tidewire/compiled.py $(HOT_PATH)

$(VENV)/.installed: $(BUILD_INPUTS) | $(BIN)/python
	$(BIN)/pip install -q -e ".[all]"
	touch $@

$(VENV)/.dev: $(BUILD_INPUTS) | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

dev: $(VENV)/.dev

run: install
	$(BIN)/tidewire serve $(ARGS)

system-deps:
	@missing=0; for t in $(SYSTEM_TOOLS); do [ -x $$t ] || missing=1; done; \
	if [ $$missing = 1 ]; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq mosquitto mosquitto-clients redis-server redis-tools redis-sentinel \
			chromium chromium-driver prometheus >/dev/null; \
	fi

# Spark 4 (the pipeline's jobs and their tests) needs a Java 17+ runtime: install Debian's when missing or older.
java-deps:
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	fi

test: dev system-deps java-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q -m "not slow" $(ARGS)

# The benchmarks' smoke tests (tests/loadtest): CI runs them after `make test`.
test-slow: dev system-deps java-deps
	$(BIN)/pytest -q -m slow $(ARGS)

# The suite again with the hot path as plain Python (tidewire/compiled.py): the fallback of a machine without a
# C compiler must pass what the compiled build passes. CI runs it after `make test-slow`.
test-pure: dev system-deps java-deps
	TIDEWIRE_PURE_PYTHON=1 $(BIN)/pytest -q -m "not slow" $(ARGS)

lint: dev
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: dev system-deps
	$(BIN)/python -m loadtest.bench all

# RabbitMQ only for the AMQP comparison (benchmarks start their own private node; the tests skip it without).
bench-deps: system-deps
	@[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq rabbitmq-server >/dev/null; }

bench-backends: dev bench-deps
	$(BIN)/python -m loadtest.amqp_bench --runs 3
	$(BIN)/python -m loadtest.rocketmq_bench --runs 3

clean:
	rm -rf $(VENV) data build .pytest_cache .mypy_cache .ruff_cache tidewire/compiled.stamp
	find . -path ./$(VENV) -prune -o -name '*.so' -print -exec rm {} +
