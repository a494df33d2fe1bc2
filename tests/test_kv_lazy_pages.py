"""The KV cache becomes resident as tokens are written (``_patch_cpu_kv_cache_lazy_pages``, issue 47).

With the patch off (vLLM's ``torch.zeros``) a worker holds its whole KV budget as RssAnon from the start;
with it on it holds what the tokens written so far need. Real SmolLM2 int4 engine, eager, 1 GiB of KV."""

import pytest

from conftest import clean_env, run_engine
from omni_patches.patches.kv_lazy_pages import lazy_zeros
from omni_platform.procfs import status_bytes

MiB = 1 << 20
KV_BYTES = 1024 * MiB
# SmolLM2-135M: 30 layers x (K, V) x 3 KV heads x 64 x 2 bytes (bf16) per token
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2


def test_a_lazy_tensor_is_zero_and_resident_only_where_written():
    import torch

    int(torch.zeros(4)[::2].abs().sum())  # torch's own first-use allocations, before the baseline
    lazy_zeros(MiB)
    before = status_bytes("RssAnon")
    t = lazy_zeros(256 * MiB)
    assert t.numel() == 256 * MiB and int(t[:: 1 << 16].abs().sum()) == 0
    assert status_bytes("RssAnon") - before < 16 * MiB  # reading zeros maps the kernel's zero page
    t[: 64 * MiB] = 1
    assert status_bytes("RssAnon") - before >= 60 * MiB
    del t


def test_a_non_positive_size_is_refused():
    with pytest.raises(ValueError, match="must be positive"):
        lazy_zeros(0)


@pytest.fixture(scope="module")
def kv_runs(int4_model_dir):
    long_prompt = " ".join(f"item {i} is on shelf {i % 7}." for i in range(260))  # about 2000 tokens

    def run(**env):
        return run_engine({"llm": {"model": str(int4_model_dir), "enforce_eager": True, "max_model_len": 4096,
                                   "max_num_seqs": 2, "kv_cache_memory_bytes": KV_BYTES},
                           "prompts": [long_prompt], "max_tokens": 8, "rss_anon": True, "kv_resident": True},
                          clean_env(VLLM_PLUGINS="omni", **env))

    return run(), run(OMNI_PATCH_KV_LAZY_PAGES_OFF="1")


@pytest.mark.engine
def test_the_kv_cache_is_resident_only_as_tokens_are_written(kv_runs, int4_model_dir):
    from transformers import AutoTokenizer

    lazy, eager_zeroed = kv_runs
    assert "KV cache of" in lazy.log and "mapped lazily" in lazy.log
    assert "mapped lazily" not in eager_zeroed.log
    (on_before,), (on_after,) = lazy["rss_anon_before"], lazy["rss_anon_after"]
    (off_before,) = eager_zeroed["rss_anon_before"]
    # with vLLM's zero-filled tensors the whole budget is resident before any request; lazily, it is not
    assert off_before - on_before > 0.8 * KV_BYTES, (off_before / MiB, on_before / MiB)
    (off_kv,) = eager_zeroed["kv_resident_before"]
    assert 0.99 * KV_BYTES <= off_kv <= KV_BYTES, off_kv  # vLLM rounds the budget down to whole blocks
    # a request of ~2000 tokens makes the pages its tokens landed in resident: the KV tensors' own pages
    # (mincore), since the worker's other anonymous memory moves too (malloc's arenas, the request's buffers)
    tokens = len(AutoTokenizer.from_pretrained(str(int4_model_dir))(
        " ".join(f"item {i} is on shelf {i % 7}." for i in range(260)))["input_ids"])
    assert tokens > 1500
    (kv_before,), (kv_after,) = lazy["kv_resident_before"], lazy["kv_resident_after"]
    assert kv_before < 64 * MiB, kv_before / MiB  # what start-up's warm-up wrote
    written = (tokens + 8) * KV_BYTES_PER_TOKEN
    assert 0.9 * written <= kv_after - kv_before <= written + 64 * MiB, (kv_before / MiB, kv_after / MiB, tokens)
    assert on_after - on_before >= 0.5 * written, (on_before / MiB, on_after / MiB, tokens)
    assert lazy["token_ids"] == eager_zeroed["token_ids"]
