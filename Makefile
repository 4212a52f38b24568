# Every install step lives here: CI runs `make test` on a clean clone.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest

.PHONY: install system-deps demo test test-all lint clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Debian packages the sandbox backend needs (GNU tar for layers with xattrs, bash for the
# shell session, procps for the tests' isolation probes, umoci to build a third-party OCI
# image in the image tests, zstd for zstd-compressed image layers). apt runs only when one
# is missing.
SYSTEM_BINARIES := tar bash ps umoci zstd
SYSTEM_PACKAGES := tar bash procps umoci zstd

system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null 2>&1 || missing=1; done; \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES); \
	fi

demo: install system-deps
	$(VENV)/bin/venusrl demo examples/demo.yaml

test: install system-deps
	$(PYTEST) -m "not slow"

test-all: install system-deps
	$(PYTEST)

lint: install
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
