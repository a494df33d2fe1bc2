"""C20: vLLM's compile hash has no CPU factor on CPU, but the C++ Inductor generates is specific to the vector
ISA it picks. OmniPlatform adds the ISA key (``omni_platform.platform.compile_isa_key``) to
``additional_config``, which vLLM's ``VllmConfig.compute_hash`` includes: a cache filled on an AVX-512 host is
not the entry an AVX2 host (here: the same CPU told ``ATEN_CPU_CAPABILITY=avx2``, which Inductor's
``pick_vec_isa`` follows) looks up. No engine starts: each interpreter builds the tiny Llama's compiled-mode
engine config as ``vllm.LLM`` would and prints its hash; then three real compiled starts of a tiny Llama compare
the tokens a moved cache gives with those the lowered ISA compiles itself."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, clean_env, run_engine

PROBE = textwrap.dedent("""
    import json, sys
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    config = EngineArgs(model=sys.argv[1], skip_tokenizer_init=True, max_model_len=256, dtype="float32",
                        kv_cache_memory_bytes=64 << 20).create_engine_config(UsageContext.LLM_CLASS)
    print(json.dumps({"hash": config.compute_hash(), "isa": config.additional_config.get("omni_cpu_isa")}))
""")


def _hash(model, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(model)], env=clean_env(VLLM_PLUGINS="omni", **env),
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_c20_compile_hash_is_keyed_by_the_vector_isa(tiny_llama):
    native, again, avx2 = _hash(tiny_llama), _hash(tiny_llama), _hash(tiny_llama, ATEN_CPU_CAPABILITY="avx2")
    assert native["isa"] and avx2["isa"].startswith("AVX2|")
    assert native["hash"] == again["hash"]  # the same machine finds its own cache again
    if native["isa"] != avx2["isa"]:  # a CPU above AVX2: the lowered ISA gets its own cache entry
        assert native["hash"] != avx2["hash"]
    else:  # an AVX2-only CPU: the same ISA, the same entry
        assert native["hash"] == avx2["hash"]


@pytest.mark.engine
def test_c20_a_cache_from_another_isa_gives_the_tokens_that_isa_compiles_itself(tmp_path):
    """The cache a native start filled, then a start told ATEN_CPU_CAPABILITY=avx2 on it (a cache moved to an AVX2
    host): that start compiles and saves an entry of its own, and its greedy tokens and log-probabilities equal
    those of an AVX2 start on an empty cache, bit for bit: moving a cache changes nothing. (Native and AVX2 code
    may part from each other at a near-tie, as eager and compiled do: the vector width changes the order of
    float additions in Inductor's and ATen's reductions; that comparison is printed, not asserted.)"""
    from omni_platform.testing import make_tiny_llama

    model = make_tiny_llama(tmp_path / "tiny", vocab_size=1024)
    config = {"llm": {"model": str(model), "enforce_eager": False, "max_model_len": 256, "skip_tokenizer_init": True,
                      "kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 4},
              "prompts": [[1, 17, 300, 5, 900], [2, 44, 7]], "max_tokens": 24, "logprobs": 2}

    def run(cache: str, **env):
        return run_engine(config, clean_env(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(tmp_path / cache), **env))

    native = run("moved")
    moved = run("moved", ATEN_CPU_CAPABILITY="avx2")
    own = run("own", ATEN_CPU_CAPABILITY="avx2")
    saved = [re.findall(r"saved AOT compiled function to (\S+)", r.log) for r in (native, moved, own)]
    assert all(len(s) == 1 for s in saved), saved  # the moved start compiled: it did not load native's code
    assert saved[0][0] != saved[1][0]
    assert moved["token_ids"] == own["token_ids"]
    assert moved["logprobs"] == own["logprobs"]
    print("native == avx2 greedy tokens:", native["token_ids"] == own["token_ids"])
