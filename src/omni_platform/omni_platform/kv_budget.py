"""KV cache budget sized from the workload rather than from a fraction of node memory.

Stock vLLM 0.28 on CPU (``vllm/v1/worker/cpu_worker.py``) reserves
``gpu_memory_utilization`` x the NUMA node's MemTotal and refuses to start when the
node's available memory is lower; on a machine whose node reports less than the
machine has, default start-up fails. When the user set neither
``kv_cache_memory_bytes`` nor ``VLLM_CPU_KVCACHE_SPACE``, OmniPlatform instead asks
for what the scheduler can use: ``max_model_len`` x ``max_num_seqs`` tokens, rounded
up to whole blocks, plus the blocks vLLM keeps for itself, capped by a fraction of the
available memory.

vLLM's block pool takes block 0 as its null block (``BlockPool.__init__``,
``vllm/v1/core/block_pool.py``, 0.28) before any request sees the pool: a budget of exactly
``max_num_seqs`` x ``ceil(max_model_len / block_size)`` blocks leaves one sequence a block
short, and a request that fits ``max_model_len`` stalls (C14, docs/cases.md).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RESERVED_BLOCKS", "KvBudget", "KvBudgetError", "plan_kv_cache_bytes"]

RESERVED_BLOCKS = 1
"""Blocks vLLM 0.28's ``BlockPool`` keeps from every pool (the null block)."""


class KvBudgetError(RuntimeError):
    """Not even one sequence of ``max_model_len`` tokens fits in the allowed memory."""


@dataclass(frozen=True)
class KvBudget:
    """A KV cache size: ``num_blocks`` blocks of ``block_size`` tokens, ``bytes`` in all."""

    num_blocks: int
    bytes: int
    capped: bool
    reason: str


def plan_kv_cache_bytes(
    *,
    bytes_per_block: int,
    block_size: int,
    max_model_len: int,
    max_num_seqs: int,
    available_bytes: int,
    max_fraction: float,
    max_bytes: int | None = None,
) -> KvBudget:
    """Size the KV cache for ``max_num_seqs`` sequences of ``max_model_len`` tokens.

    With ``max_bytes`` (``OMNI_KV_CACHE_MAX_MIB``), the budget is also held under that ceiling, but never
    below one sequence of ``max_model_len`` tokens: a server started without ``--max-model-len`` takes the
    model's whole context (32768 tokens on Qwen2.5) for each of ``max_num_seqs`` sequences, 7 GiB on
    Qwen2.5-Coder-1.5B, which an 8 GiB machine cannot hold; one full-length request must still fit.

    Args:
        bytes_per_block: bytes of one block over all attention layers (K and V).
        block_size: tokens per block.
        max_model_len: tokens per sequence.
        max_num_seqs: sequences the scheduler may run at once.
        available_bytes: memory available now (bytes).
        max_fraction: at most this fraction of ``available_bytes`` is used.
        max_bytes: a ceiling in bytes that yields to one full-length sequence (None: no ceiling).

    Returns:
        The budget; ``bytes == num_blocks * bytes_per_block`` exactly, so vLLM's
        ``kv_cache_memory_bytes // page size`` gives back ``num_blocks``, of which
        ``num_blocks - RESERVED_BLOCKS`` reach requests.

    Raises:
        KvBudgetError: the cap cannot hold the blocks of one ``max_model_len`` sequence.
        ValueError: a non-positive size.
    """
    for name, value in (
        ("bytes_per_block", bytes_per_block),
        ("block_size", block_size),
        ("max_model_len", max_model_len),
        ("max_num_seqs", max_num_seqs),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    blocks_per_seq = -(-max_model_len // block_size)
    wanted = blocks_per_seq * max_num_seqs + RESERVED_BLOCKS
    cap_bytes = int(max(0, available_bytes) * max_fraction)
    cap_blocks = cap_bytes // bytes_per_block
    if cap_blocks < blocks_per_seq + RESERVED_BLOCKS:
        raise KvBudgetError(
            f"one sequence of max_model_len={max_model_len} tokens needs "
            f"{(blocks_per_seq + RESERVED_BLOCKS) * bytes_per_block / 2**20:.1f} MiB of KV cache "
            f"(with vLLM's null block), but only "
            f"{cap_bytes / 2**20:.1f} MiB ({max_fraction:g} of {available_bytes / 2**20:.1f} MiB "
            "available) may be used. Lower max_model_len, free memory, or set "
            "kv_cache_memory_bytes explicitly."
        )
    ceiling_blocks = None
    if max_bytes is not None:
        ceiling_blocks = max(max_bytes // bytes_per_block, blocks_per_seq + RESERVED_BLOCKS)
    capped = wanted > cap_blocks
    num_blocks = min(wanted, cap_blocks)
    mib = num_blocks * bytes_per_block / 2**20
    if ceiling_blocks is not None and num_blocks > ceiling_blocks:
        num_blocks = ceiling_blocks
        mib = num_blocks * bytes_per_block / 2**20
        seqs = (num_blocks - RESERVED_BLOCKS) / blocks_per_seq
        reason = (
            f"max_model_len={max_model_len} x max_num_seqs={max_num_seqs} wants {wanted} blocks; held at "
            f"{num_blocks} blocks ({mib:.1f} MiB, {seqs:.1f} full-length sequences) by OMNI_KV_CACHE_MAX_MIB="
            f"{max_bytes / 2**20:.0f}, never below one full-length sequence"
        )
        return KvBudget(num_blocks, num_blocks * bytes_per_block, True, reason)
    if capped:
        reason = (
            f"max_model_len={max_model_len} x max_num_seqs={max_num_seqs} wants {wanted} "
            f"blocks; capped at {num_blocks} blocks ({mib:.1f} MiB) = OMNI_KV_CACHE_MAX_FRACTION="
            f"{max_fraction:g} of {available_bytes / 2**20:.0f} MiB available"
        )
    else:
        reason = (
            f"max_model_len={max_model_len} x max_num_seqs={max_num_seqs} = {wanted - RESERVED_BLOCKS} "
            f"blocks of {block_size} tokens + {RESERVED_BLOCKS} for vLLM's null block ({mib:.1f} MiB)"
        )
    return KvBudget(num_blocks, num_blocks * bytes_per_block, capped, reason)
