# startsafe: two commands on a fresh machine.
#   make run   install, migrate, seed demo data, serve console + API + worker + schedule
#              on the embedded default (SQLite, a Celery transport with no server)
#   make test  install what the tests need and run the whole suite on PostgreSQL
#   make bench seed a PostgreSQL database at scale, serve it with gunicorn, measure
#              (docs/performance.md; BENCH_ARGS='--scale 0.01' for a quick run)
#   make mutate  mutation testing of the rule modules (mutmut; docs/guarantees.md,
#              "Mutation testing"); not part of make test

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TEST_DATABASE_URL := $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/startsafe)
# make mutate's own database by default, so it can run beside make test; MUTATE_JOBS
# mutants at a time (each on its own copy of the test database, mutate/pytest_plugin.py).
MUTATE_DATABASE_URL := $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/startsafe_mutate)
MUTATE_JOBS ?= 1
MUTMUT = DATABASE_URL="$(MUTATE_DATABASE_URL)" DEBUG=1 MUTATE_JOBS=$(MUTATE_JOBS) $(VENV)/bin/mutmut
# make run's web server port (PORT=8001 make run, or make run PORT=8001).
PORT ?= 8000

.PHONY: run test lint format install install-test clean bench mutate

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml startsafe_client/pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -e '.[test]' -e './startsafe_client[pydantic-ai,openai-agents,langchain,mcp]'
	touch $@ $(VENV)/.installed-run

$(VENV)/.installed-bench: pyproject.toml startsafe_client/pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -e '.[bench]' -e ./startsafe_client
	touch $@ $(VENV)/.installed-run

$(VENV)/.installed-mutate: pyproject.toml $(VENV)/.installed-test
	$(VENV)/bin/pip install --quiet -e '.[test,mutate]'
	touch $@

install: $(VENV)/.installed-run
install-test: $(VENV)/.installed-test

# var/dev.env (written once, then kept) holds DEBUG=1 and this clone's SECRET_KEY;
# settings read it when it is there, so manage.py in another terminal works as these
# processes do (startsafe/devenv.py). The environment wins over it. Honcho reads no
# env file (--env /dev/null): by default it would load a .env here (docker compose's,
# made from .env.example: DEBUG=0, the hosts db and redis) over the environment, for
# the web server and the worker only.
run: install
	$(PY) -m startsafe.devenv
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo --base-url http://127.0.0.1:$(PORT)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho -f Procfile.dev --env /dev/null \
		start --port $(PORT)

test: install-test
	@$(PY) -m startsafe.checkdb "$(TEST_DATABASE_URL)"
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
		else echo "Browser tests need Debian's chromium: sudo apt-get install -y chromium"; exit 1; fi; }
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; \
		else echo "The proxy tests (tests/test_proxy.py) need Debian's nginx: sudo apt-get install -y nginx"; exit 1; fi; }
	DATABASE_URL="$(TEST_DATABASE_URL)" DEBUG=1 $(PY) -m pytest $(PYTEST_ARGS)

# Its own database (BENCH_DATABASE_URL or DATABASE_URL, default startsafe_bench on
# 127.0.0.1), created and dropped by the run; wrk comes from Debian (apt-get install wrk).
bench: $(VENV)/.installed-bench
	$(PY) -m bench.run $(BENCH_ARGS)

# Mutation testing: [tool.mutmut] in pyproject.toml names the rule modules and the tests
# that own them; mutmut runs, per mutant, only the tests that reach the mutated function,
# MUTATE_JOBS mutants at a time (1: the machine is shared; 2 on an idle 2-core one).
# Starts afresh: mutants/ holds one run's results. MUTATE_RESUME=1 goes on with a
# stopped run, re-tests the functions changed since, then the mutants not killed
# (mutmut keeps a verdict until it is named); test files added to [tool.mutmut]'s
# list keep the verdicts (mutate/carry_over.py), any other change to it starts
# afresh. The report (var/mutate/report.txt) lists every mutant not killed;
# mutate.report fails under MUTATE_MIN_SCORE (90) percent killed or on a survivor
# docs/guarantees.md does not judge.
mutate: $(VENV)/.installed-mutate
	@$(PY) -m startsafe.checkdb "$(MUTATE_DATABASE_URL)"
	$(if $(MUTATE_RESUME),$(PY) -m mutate.carry_over,rm -rf mutants)
	$(MUTMUT) run --max-children $(MUTATE_JOBS)
	$(if $(MUTATE_RESUME),names=$$($(PY) -m mutate.report --not-killed); \
		[ -z "$$names" ] || $(MUTMUT) run --max-children $(MUTATE_JOBS) $$names)
	$(PY) -m mutate.carry_over --record
	$(PY) -m mutate.report

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install-test
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf var .pytest_cache mutants
