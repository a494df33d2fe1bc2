"""KV cache budget (omni_platform.kv_budget)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_platform.kv_budget import KvBudgetError, plan_kv_cache_bytes

GiB = 1 << 30
# SmolLM2-135M in bf16: 30 layers x 2 (K, V) x 128 tokens x 3 KV heads x 64 x 2 bytes.
SMOLLM2_BLOCK = 30 * 2 * 128 * 3 * 64 * 2


def test_sized_from_max_model_len_times_max_num_seqs():
    b = plan_kv_cache_bytes(bytes_per_block=SMOLLM2_BLOCK, block_size=128, max_model_len=1000,
                            max_num_seqs=4, available_bytes=8 * GiB, max_fraction=0.5)
    assert b.num_blocks == 8 * 4 + 1  # ceil(1000 / 128) = 8 blocks per sequence, and the null block
    assert b.bytes == 33 * SMOLLM2_BLOCK
    assert not b.capped
    assert "max_model_len=1000 x max_num_seqs=4" in b.reason


def test_vllm_defaults_are_capped_by_available_memory():
    b = plan_kv_cache_bytes(bytes_per_block=SMOLLM2_BLOCK, block_size=128, max_model_len=8192,
                            max_num_seqs=256, available_bytes=8 * GiB, max_fraction=0.5)
    assert b.capped
    assert b.bytes <= 4 * GiB
    assert b.num_blocks == (4 * GiB) // SMOLLM2_BLOCK


def test_one_sequence_that_does_not_fit_is_refused():
    with pytest.raises(KvBudgetError, match="max_model_len=8192"):
        plan_kv_cache_bytes(bytes_per_block=SMOLLM2_BLOCK, block_size=128, max_model_len=8192,
                            max_num_seqs=1, available_bytes=100 << 20, max_fraction=0.5)


@given(
    st.integers(1, 1 << 22), st.sampled_from([16, 32, 64, 128]), st.integers(1, 1 << 17),
    st.integers(1, 1024), st.integers(0, 1 << 40), st.floats(0.01, 1.0),
)
def test_budget_is_whole_blocks_within_the_cap(bpb, bs, mml, seqs, avail, frac):
    try:
        b = plan_kv_cache_bytes(bytes_per_block=bpb, block_size=bs, max_model_len=mml,
                                max_num_seqs=seqs, available_bytes=avail, max_fraction=frac)
    except KvBudgetError:
        assert int(avail * frac) < (-(-mml // bs) + 1) * bpb
        return
    assert b.bytes == b.num_blocks * bpb
    assert b.bytes <= int(avail * frac)
    assert b.num_blocks >= -(-mml // bs) + 1
    assert b.num_blocks <= -(-mml // bs) * seqs + 1
    assert b.capped == (b.num_blocks < -(-mml // bs) * seqs + 1)


@given(st.integers(1, 4096), st.sampled_from([16, 32, 64, 128]), st.integers(1, 64))
def test_every_sequence_gets_its_blocks_from_vllms_own_block_pool(mml, bs, seqs):
    """C14: vLLM's BlockPool, built with the planned block count, hands out max_num_seqs x
    ceil(max_model_len / block_size) blocks at once (the null block taken first)."""
    from vllm.v1.core.block_pool import BlockPool

    b = plan_kv_cache_bytes(bytes_per_block=1 << 10, block_size=bs, max_model_len=mml,
                            max_num_seqs=seqs, available_bytes=1 << 40, max_fraction=0.5)
    pool = BlockPool(num_gpu_blocks=(b.bytes // (1 << 10)), enable_caching=False, hash_block_size=bs)
    per_seq = -(-mml // bs)
    assert pool.get_num_free_blocks() == per_seq * seqs
    blocks = pool.get_new_blocks(per_seq * seqs)
    assert len(blocks) == per_seq * seqs and not any(blk.is_null for blk in blocks)


def _completion(port: int, model: str, prompt_ids: list[int], max_tokens: int) -> dict:
    import json
    import urllib.request

    body = json.dumps({"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0.0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _preemptions(port: int) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:num_preemptions_total")]
    assert lines, "vLLM's /metrics has no vllm:num_preemptions_total"
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


@pytest.mark.engine
@pytest.mark.parametrize("seqs", [1, 2])
def test_c14_requests_that_fit_max_model_len_finish_together_without_preemption(int4_model_dir, tmp_path, seqs):
    """--max-num-seqs N --max-model-len 256: N requests of 12 prompt + 230 generated tokens at once
    all finish, and vLLM counts no preemption (the budget holds vLLM's null block too)."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from conftest import clean_env
    from harness.server_process import free_port, stop_group, wait_healthy

    port, log = free_port(), tmp_path / "server.log"
    cmd = [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(int4_model_dir), "--enforce-eager",
           "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(seqs), "--max-model-len", "256"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=clean_env(VLLM_PLUGINS="omni"), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/health", 600, log)
        prompts = [[100 + 7 * i + j for j in range(12)] for i in range(seqs)]
        with ThreadPoolExecutor(seqs) as pool:
            outs = list(pool.map(lambda p: _completion(port, str(int4_model_dir), p, 230), prompts))
        assert [o["usage"]["completion_tokens"] for o in outs] == [230] * seqs
        assert _preemptions(port) == 0
    finally:
        stop_group(proc)
    assert f"max_num_seqs={seqs}" in log.read_text() and "null block" in log.read_text()


# Qwen2.5-Coder-1.5B in bf16: 28 layers x 2 (K, V) x 128 tokens x 2 KV heads x 128 x 2 bytes.
QWEN_BLOCK = 28 * 2 * 128 * 2 * 128 * 2


def test_a_ceiling_holds_a_full_context_server_to_what_an_8_gib_machine_can_live_with():
    # omni-vllm serve with no --max-model-len: the model's 32768 tokens for each of 8 sequences (7 GiB)
    b = plan_kv_cache_bytes(bytes_per_block=QWEN_BLOCK, block_size=128, max_model_len=32768, max_num_seqs=8,
                            available_bytes=16 * GiB, max_fraction=0.5, max_bytes=2 * GiB)
    assert b.capped and b.bytes <= 2 * GiB
    assert b.num_blocks == (2 * GiB) // QWEN_BLOCK
    assert b.num_blocks - 1 >= 32768 // 128  # one full-length sequence fits beside vLLM's null block
    assert "OMNI_KV_CACHE_MAX_MIB=2048" in b.reason and "full-length sequences" in b.reason


def test_the_ceiling_yields_to_one_full_length_sequence():
    b = plan_kv_cache_bytes(bytes_per_block=QWEN_BLOCK, block_size=128, max_model_len=32768, max_num_seqs=8,
                            available_bytes=16 * GiB, max_fraction=0.5, max_bytes=256 << 20)
    assert b.num_blocks == 32768 // 128 + 1


def test_a_budget_under_the_ceiling_is_unchanged():
    args = dict(bytes_per_block=QWEN_BLOCK, block_size=128, max_model_len=4096, max_num_seqs=8,
                available_bytes=16 * GiB, max_fraction=0.5)
    assert plan_kv_cache_bytes(**args, max_bytes=2 * GiB) == plan_kv_cache_bytes(**args)
