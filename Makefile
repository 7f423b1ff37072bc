# Two commands on a fresh machine: `make run` and `make test`. Both install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test install lint pyz clean

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

install: $(STAMP)

pyz: $(STAMP)
	$(PY) -m clients.build --out static/downloads

run: install pyz
	$(PY) manage.py migrate --noinput
	$(PY) manage.py first_run_link --public-url http://$(HOST):$(PORT)
	$(VENV)/bin/daphne -b $(HOST) -p $(PORT) ai1net.asgi:application

test: install pyz
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .test-db* static/downloads
