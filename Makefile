# Two commands on a fresh machine: `make run` and `make test`. Both install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test deps install lint pyz clean bench bench-quick

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

install: $(STAMP)

# System programs the suite needs beyond Python and make (Chromium, ripgrep, ...): installed with apt-get
# when missing and allowed, else one line naming them. A no-op once they are there.
deps:
	@bash scripts/system-deps.sh

pyz: $(STAMP)
	$(PY) -m clients.build --out static/downloads

run: install pyz
	$(PY) manage.py migrate --noinput
	$(PY) manage.py first_run_link --public-url http://$(HOST):$(PORT)
	$(VENV)/bin/daphne -b $(HOST) -p $(PORT) ai1net.asgi:application

# Two workers (pytest-xdist) on the two cores: end-to-end tests mostly wait on real processes, so two at a
# time fill the cores; each worker has its own database and Redis prefix. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2

test: deps install pyz
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The hot-path benchmarks of issue 10, each beside its bare baseline (minutes; --quick: under 3).
bench: install pyz
	$(PY) -m bench all $(BENCH_ARGS)

bench-quick: install pyz
	$(PY) -m bench all --quick $(BENCH_ARGS)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .test-db* static/downloads
