"""omni-patches' _patch_tokenizer_pool_in_background on SmolLM2's real tokenizer (no engine).

The replacement of vLLM's ``maybe_make_thread_pool`` returns the pooled tokenizer without copies;
with the engine core in another process it fills the pool in a thread, in one process it leaves
the copies to the borrowers. Either way every call answers as the tokenizer does.
"""

import time

import pytest


@pytest.fixture()
def tokenizer(real_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_model)


def _patched():
    from vllm.tokenizers.hf import maybe_make_thread_pool

    from omni_patches.patches.tokenizer_pool import PATCH

    (wrapper,) = PATCH.make(maybe_make_thread_pool)
    return wrapper


@pytest.mark.parametrize("multiprocessing", ["1", "0"], ids=["engine-core-apart", "one-process"])
def test_the_pool_is_filled_in_the_background_or_on_demand(tokenizer, monkeypatch, multiprocessing):
    from omni_patches.patches.tokenizer_pool import pool_of

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", multiprocessing)
    text = "def add(a, b):\n    return a + b  # naïve"
    want_ids = tokenizer.encode(text)
    want_text = tokenizer.decode(want_ids)
    import copy

    pooled = _patched()(copy.copy(tokenizer), 2)  # no event loop here: the env var decides
    found = pool_of(pooled)
    assert found is not None, "vLLM's pooled class, its pool found in the closure"
    pool, _ = found
    if multiprocessing == "1":
        deadline = time.monotonic() + 60
        while pool.qsize() < 2:
            assert time.monotonic() < deadline, f"the background thread made {pool.qsize()} of 2 copies"
            time.sleep(0.05)
    else:
        assert pool.qsize() == 0, "no copy made ahead in the one-process layout"
    assert pooled.encode(text) == want_ids and pooled.decode(want_ids) == want_text
    assert pool.qsize() == (2 if multiprocessing == "1" else 1), "a borrower's own copy returns to the pool"


def test_a_tokenizer_vllm_does_not_pool_is_returned_as_it_is():
    class NotATokenizer:
        pass

    thing = NotATokenizer()
    assert _patched()(thing, 2) is thing


def test_with_the_switch_set_vllm_makes_its_copies_before_it_returns(real_model):
    """OMNI_PATCH_TOKENIZER_POOL_OFF=1: apply_all leaves vLLM's function in place, whose pool is full at return."""
    import json
    import subprocess
    import sys

    from conftest import clean_env

    code = f"""
import json, vllm.renderers.hf as r
from transformers import AutoTokenizer
from omni_patches import apply_all
from omni_patches.patches import MARKER
from omni_patches.patches.tokenizer_pool import pool_of
apply_all()
pooled = r.maybe_make_thread_pool(AutoTokenizer.from_pretrained({str(real_model)!r}), 2)
print(json.dumps({{"marker": getattr(r.maybe_make_thread_pool, MARKER, None), "size": pool_of(pooled)[0].qsize()}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(OMNI_PATCH_TOKENIZER_POOL_OFF="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"marker": None, "size": 2}


def test_inside_a_running_event_loop_the_engine_core_is_elsewhere(monkeypatch):
    """The OpenAI server builds its AsyncLLM (an engine core client) inside its event loop, where omni's layout
    leaves VLLM_ENABLE_V1_MULTIPROCESSING=0: the copies are still made in the background there."""
    import asyncio

    from omni_patches.patches.tokenizer_pool import _engine_core_elsewhere

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    async def inside():
        return _engine_core_elsewhere()

    assert asyncio.run(inside()) is True and _engine_core_elsewhere() is False
