# Ferry — every target a newcomer needs. `make up` runs the mesh, `make test`
# passes the tests; both run `make setup` first, which is idempotent.
SHELL := /bin/bash
PY := .venv/bin/python
PIP := .venv/bin/pip
SERVICES := $(wildcard services/*)
STAMP := .venv/.setup-stamp
# The hot modules that have a compiled twin (ferry.extensions.TWINS; docs/performance.md).
TWIN_SOURCES := libs/ferry/ferry/store/batch_input.py libs/ferry/ferry/codec/entry.py \
	libs/ferry/ferry/wire/decoder.py libs/ferry/ferry/codec/record_check.py \
	libs/ferry/ferry/store/_batch_input_cy.pyx libs/ferry/ferry/codec/_record_check_cy.pyx \
	libs/ferry/ferry/native_crc32c.h
TWIN_STAMP := .venv/.twins-stamp
# The tests `make test` runs a second time on the pure modules (FERRY_NO_EXTENSIONS=1):
# those of the twins' modules, and the client's PULL decoder (record_check).
PURE_TESTS ?= tests/store tests/wire tests/codec tests/client/test_records.py
BENCH ?=
HA ?=
PROMETHEUS ?=

.PHONY: setup up down test fuzz lint bench spark-report clean system-deps

setup: system-deps $(STAMP) $(TWIN_STAMP)

# Debian packages: installed when missing and we are root, otherwise the
# exact command to run is printed and setup stops.
system-deps:
	@missing=""; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	command -v etcdctl >/dev/null 2>&1 || missing="$$missing etcd-client"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v prometheus >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    echo "setup: installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "setup: please run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

$(STAMP): libs/ferry/pyproject.toml $(wildcard services/*/pyproject.toml) spark/pyproject.toml requirements-dev.txt
	@test -x $(PY) || python3 -m venv .venv
	@echo "setup: installing Python packages into .venv (log: .venv/setup.log)"
	@( $(PIP) install -q --upgrade pip && $(PIP) install -q -r requirements-dev.txt \
	   && $(PIP) install -q -e "libs/ferry[idempotence,celery]" $(foreach s,$(SERVICES),-e $(s)) -e spark ) > .venv/setup.log 2>&1 \
	   || { tail -30 .venv/setup.log; exit 1; }
	@touch $(STAMP)

# The compiled twins (mypyc and, for the staging loop, Cython: both pinned in
# requirements-dev.txt), beside their pure modules,
# rebuilt when one changes. Never fails: without a C compiler the pure modules run and
# the build says so in one line.
$(TWIN_STAMP): $(STAMP) $(TWIN_SOURCES) libs/ferry/build_twins.py libs/ferry/ferry/extensions.py
	@echo "setup: compiling the twins of the hot modules (mypyc and Cython, about a minute)"
	@$(PY) libs/ferry/build_twins.py
	@touch $(TWIN_STAMP)

up: setup
	@$(PY) deploy/local_mesh.py up $(if $(filter 1 yes true,$(HA)),--ha) \
	    $(if $(filter 1 yes true,$(PROMETHEUS)),--prometheus)

down: setup
	@$(PY) deploy/local_mesh.py down

# The tests mostly wait (real processes, real sockets): three workers, one module per
# worker at a time (module fixtures stay in one process), take about half the time.
TEST_WORKERS ?= 3
# The whole suite runs on the compiled twins (when built); then the store, wire and codec
# tests run again on the pure-Python modules.
test: setup
	@$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)
	@echo "test: again on the pure-Python modules (FERRY_NO_EXTENSIONS=1): $(PURE_TESTS)"
	@FERRY_NO_EXTENSIONS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PURE_TESTS)

# The fuzz tests at their full sizes (issues 13 and 24), auth on: 1,000,000 wire frames
# (200,000 more with auth off), 50,000 replication-port openings, 100,000 HTTP requests
# over every service; `make test` runs a tenth (docs/security.md, Fuzzing).
fuzz: setup
	@FERRY_FUZZ_FRAMES=1000000 FERRY_FUZZ_HTTP_REQUESTS=100000 $(PY) -m pytest -q -s tests/fuzz $(PYTEST_ARGS)

lint: setup
	@.venv/bin/ruff check libs services tests bench spark
	@.venv/bin/mypy libs/ferry/ferry services/broker/ferry_broker services/namesrv/ferry_namesrv services/delay-scheduler/ferry_delay_scheduler services/txn-checker/ferry_txn_checker services/dedup/ferry_dedup services/console/ferry_console spark/ferry_spark

bench: setup
	@$(PY) bench/run.py $(BENCH)

# The Spark report (docs/spark.md) on the mesh of `make up`: its namesrv, the spans under
# var/traces and %TRACE%; Parquet tables and report.html under var/spark/.
SPARK_VAR := $(or $(FERRY_MESH_VAR_DIR),var)
spark-report: setup
	@$(PY) spark/jobs/report.py --namesrv 127.0.0.1:$(or $(FERRY_MESH_NAMESRV_PORT),9876) \
	   --trace-dir $(SPARK_VAR)/traces --out $(SPARK_VAR)/spark

clean:
	rm -rf .venv var .pytest_cache .mypy_cache .ruff_cache
	find libs/ferry -name '*.so' -delete
