# Every install step lives here: CI runs `make test` on a clean clone.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest

.PHONY: install demo test test-all lint clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/venusrl demo

test: install
	$(PYTEST) -m "not slow"

test-all: install
	$(PYTEST)

lint: install
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
