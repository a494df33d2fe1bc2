"""C20: vLLM's compile hash has no CPU factor on CPU, but the C++ Inductor generates is specific to the vector
ISA it picks. OmniPlatform adds the ISA key (``omni_platform.platform.compile_isa_key``) to
``additional_config``, which vLLM's ``VllmConfig.compute_hash`` includes: a cache filled on an AVX-512 host is
not the entry an AVX2 host (here: the same CPU told ``ATEN_CPU_CAPABILITY=avx2``, which Inductor's
``pick_vec_isa`` follows) looks up. No engine starts: each interpreter builds the tiny Llama's compiled-mode
engine config as ``vllm.LLM`` would and prints its hash. Greedy tokens under a lowered ISA are not compared
here (that takes two cold compiles)."""

import json
import subprocess
import sys
import textwrap

from conftest import REPO, clean_env

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
