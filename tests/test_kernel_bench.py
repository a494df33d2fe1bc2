"""harness.kernels.matrix's correctness gate: every candidate is checked against its reference before
it is timed, and a kernel that raises or returns garbage is named with the reason, not timed."""

import math

import pytest
import torch

from harness.kernels import matrix as kernel_bench
from harness.memory.tree import anon_huge_bytes, file_pmd_mapped_bytes
from omni_quant.format.quant_math import quantize
from omni_quant.kernels import w4a8 as native


def test_real_kernels_pass_and_broken_ones_are_named_with_the_reason():
    kernels, weights = kernel_bench._kernels(64, 256, 64, copies=1)
    kernels["nan"] = (lambda x, i: torch.full((x.shape[0], 64), float("nan")), 1)
    kernels["raises"] = (lambda x, i: (_ for _ in ()).throw(RuntimeError("this CPU lacks AVX512_BF16\nmore")), 1)
    kernels["zeros"] = (lambda x, i: torch.zeros(x.shape[0], 64), 1)
    passed, failed = kernel_bench.check(kernels, weights, 256)
    assert set(failed) == {"nan", "raises", "zeros"}
    assert failed["raises"] == "RuntimeError: this CPU lacks AVX512_BF16"
    assert "SQNR nan dB" in failed["nan"] and f"< {kernel_bench.MIN_SQNR_DB}" in failed["zeros"]
    assert {"int4pack", "dequant_bf16", "bf16"} <= set(passed)
    if native.available():
        assert {f"omni_w4a8_{isa}" for isa in native.supported_isas() if isa != "scalar"} <= set(passed)
    assert all(db >= kernel_bench.MIN_SQNR_DB and not math.isnan(db) for db in passed.values())


def test_symmetric_kernels_are_judged_against_zero_point_8():
    """A kernel computing (q - 8) * s (integer zero point 8) is right against that reference and
    would fail against cpu_int4's float zeros: the gate must not reject it for the format."""
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 0.02
    q, s, z = quantize(w, 64, torch.bfloat16)
    sym = lambda x, i: x.float() @ ((q.float() - 8) * s.float().repeat_interleave(64, 1)).T  # noqa: E731
    passed, failed = kernel_bench.check({"wna16": (sym, 1)}, (w, q, s, z), 256)
    assert "wna16" in passed and not failed
    passed, failed = kernel_bench.check({"int4pack": (sym, 1)}, (w, q, s, z), 256)
    assert "int4pack" in failed


@pytest.mark.parametrize("model", sorted(kernel_bench.SHAPES))
def test_shapes_are_the_models_linears(model):
    """The shapes the matrix times are the real models' (one decoder layer's linears and the head)."""
    from harness.models.registry import MODELS

    layers = {name: (n, k) for name, n, k, _ in kernel_bench.SHAPES[model]}
    assert set(layers) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}
    assert model in MODELS


def test_decode_rows_rotate_through_rotation_bytes_of_copies_never_one():
    """A decode-row timing never rereads one copy (the head alone, 117 MB, was timed from a VM host's
    hidden cache at 52 GB/s), fills ROTATION_BYTES even when sysfs shows a small cache, and stays in
    the budget."""
    head = 151936 * 1536 // 2
    assert kernel_bench.rotation_copies(head, 32 << 20, 1536 << 20) == -(-kernel_bench.ROTATION_BYTES // head)
    assert kernel_bench.rotation_copies(head, 32 << 20, head) == 2  # the budget never drops it to one
    small = 2048 * 1536 // 2
    n = kernel_bench.rotation_copies(small, 32 << 20, 1536 << 20)
    assert n * small >= kernel_bench.ROTATION_BYTES and (n - 1) * small < kernel_bench.ROTATION_BYTES
    assert kernel_bench.rotation_copies(small, 1 << 31, 8 << 30) * small >= 2 << 31  # twice a larger cache


def test_kernels_alternate_within_rounds_and_never_reread_their_last_copy():
    """interleaved_us runs each kernel once a round, between the round's two reads, in a fixed order; each set of
    copies has its own counter, so a kernel (or the kernels sharing a set) never reads the copy read last
    from its set, even when the number of copies divides the number of kernels."""
    for copies in (5, 3, 2):
        log = []
        calls = {name: (lambda i, name=name, log=log: log.append((name, i)))
                 for name in ("a", "omni_w4a8_x", "omni_w4a8_y")}
        read = lambda log=log: log.append(("read", -1)) or 30.0  # noqa: E731
        per_round, reads = kernel_bench.interleaved_us(calls, rounds=4, copies=copies, read=read,
                                                       share=kernel_bench.copy_set)
        assert [len(v) for v in per_round.values()] == [4, 4, 4] and reads == [30.0] * 4
        assert kernel_bench.copy_set("omni_sb_avx2") == kernel_bench.copy_set("omni_sb_avx512vnni") != "omni_w4a8_"
        # vLLM's kernel alone reads the copies of vLLM's kernel with the correction: one counter for both
        assert kernel_bench.copy_set("w4a8_kernel") == kernel_bench.copy_set("w4a8") != kernel_bench.copy_set("bf16")
        assert [n for n, _ in log] == ["a", "omni_w4a8_x", "omni_w4a8_y"] + ["read", "a", "omni_w4a8_x",
                                                                             "omni_w4a8_y", "read"] * 4
        for group in ({"a"}, {"omni_w4a8_x", "omni_w4a8_y"}):
            seq = [i for n, i in log if n in group]
            assert seq == [c % copies for c in range(len(seq))], (copies, group, seq)
            assert all(x != y for x, y in zip(seq[:-1], seq[1:], strict=True))


def test_a_burst_streams_consecutive_copies_and_reports_time_per_call():
    """With burst=B a round's sample is B calls on B consecutive copies of the kernel's set (the next
    kernel of the set goes on from there), and the time is per call; B streams BURST_BYTES (or twice
    the cache) and never more than half the copies."""
    log = []
    calls = {name: (lambda i, name=name: log.append((name, i))) for name in ("w4a8", "w4a8_kernel")}
    per_round, _ = kernel_bench.interleaved_us(calls, rounds=2, copies=16, share=kernel_bench.copy_set, burst=3)
    assert [i for _, i in log] == list(range(2 + 2 * 2 * 3))  # warm-ups 0, 1; then 2..4, 5..7, 8..10, 11..13
    assert [n for n, _ in log[2:]] == ["w4a8"] * 3 + ["w4a8_kernel"] * 3 + ["w4a8"] * 3 + ["w4a8_kernel"] * 3
    assert all(len(v) == 2 for v in per_round.values())
    slowed = iter([12.0, 30.0, 31.0, 9.0])  # a read slowed by the host on either side of the kernels
    _, reads = kernel_bench.interleaved_us(calls, rounds=2, copies=16, read=lambda: next(slowed), burst=3)
    assert reads == [30.0, 31.0]  # the round's read is the faster one: ratios are never lifted by a slow read
    one = 17920 * 1536 // 2  # gate_up_proj's codes
    b = kernel_bench.burst_calls(one, 32 << 20, 40)
    assert b * one >= kernel_bench.BURST_BYTES and (b - 1) * one < kernel_bench.BURST_BYTES
    assert kernel_bench.burst_calls(one, 32 << 20, 4) == 2 and kernel_bench.burst_calls(151936 * 768, 32 << 20, 5) == 1


def test_the_table_quotes_the_paired_percent_and_only_rows_measured():
    """The docs' table: at decode rows the percent of the read in the same rounds (not of the run's
    highest sample), and no empty sections for row counts the run did not measure."""
    row = {"model": "m", "layer": "down_proj", "m": 1, "kernel": "omni_sb_avx2", "us": 10.0, "gbps": 26.7,
           "pct_ceiling": 51.0, "pct_paired_read": 92.4}
    art = {"read_bandwidth_gbps": 52.2, "read_bandwidth_samples_gbps": [30.0, 52.2], "threads": 2,
           "cpu": {"cpu_model": "x", "cpu_flags": ["avx2"]}, "results": [row]}
    text = kernel_bench.table(art)
    assert "| m | down_proj | 26.7 (92%) |" in text
    art["results"] = [dict(row, pct_paired_read=131.0, above_read=True)]  # a cache, not memory: marked
    assert "| m | down_proj | 26.7 (131%)! |" in kernel_bench.table(art)
    assert "M=512" not in text and "M=16" not in text


def test_huge_page_copies_give_the_same_results():
    """--huge-pages moves every kernel's copies (huge_pages.place) and changes no result."""
    kernels, weights = kernel_bench._kernels(64, 256, 64, copies=1, huge=True)
    passed, failed = kernel_bench.check(kernels, weights, 256)
    plain, _ = kernel_bench.check(*kernel_bench._kernels(64, 256, 64, copies=1), 256)
    assert passed.keys() == plain.keys(), (passed, plain)
    assert all(passed[k] == plain[k] or abs(passed[k] - plain[k]) < 1e-6 for k in plain), (passed, plain)  # inf: exact


def test_huge_share_reads_anon_huge_pages_and_counts_the_placed_copies(tmp_path):
    """The diagnostic of a kernel that swings between runs: how much of its copies sat on huge pages."""
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text("Rss: 409600 kB\nAnonHugePages:    204800 kB\nFilePmdMapped:    6144 kB\nSwap: 0 kB\n")
    assert anon_huge_bytes(rollup) == 200 << 20
    assert file_pmd_mapped_bytes(rollup) == 6 << 20
    assert anon_huge_bytes(tmp_path / "absent") is None
    rollup.write_text("Rss: 1 kB\n")
    assert anon_huge_bytes(rollup) is None
    assert kernel_bench.huge_share(10 << 20, 60 << 20, [50 << 20, 50 << 20]) == 0.5
    assert kernel_bench.huge_share(None, 1, [1]) is None and kernel_bench.huge_share(0, 1, []) is None
    placed: list[int] = []
    kernel_bench._kernels(256, 1024, 64, copies=1, huge=True, placed=placed)
    from omni_quant.runtime import huge_pages
    if huge_pages.thp_mode() in ("always", "madvise"):  # int4pack's codes alone are 128 KiB
        assert placed and min(placed) >= huge_pages.MIN_BYTES
    else:
        assert placed == []
    unplaced: list[int] = []
    kernel_bench._kernels(256, 1024, 64, copies=1, placed=unplaced)
    assert unplaced == []
