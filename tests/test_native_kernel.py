"""omni_quant.kernels.w4a8: omni's W4A8 kernel, every instruction-set path this CPU runs, against the
dequantize-then-matmul reference; the prefill (dequantize + bf16 GEMM) path; the errors; inductor."""

import itertools
import logging

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import skips
from omni_quant.format.quant_math import dequantize, quantize, reference_linear, sqnr_db
from omni_quant.kernels import w4a8 as native

pytestmark = skips.needs_kernel

ISAS = native.supported_isas() if native.available() else []


def _layer(n, k, g, seed, offset=0.0):
    gen = torch.Generator().manual_seed(seed)
    q, s, z = quantize(torch.randn(n, k, generator=gen) * 0.05 + offset, g, torch.bfloat16)
    return q, s, z, gen


def test_this_cpu_runs_at_least_the_portable_path_and_auto_is_the_fastest():
    assert ISAS[-1] == "scalar"
    assert native.best_isa() == ISAS[0]
    assert set(ISAS) <= {"avx512vnni", "avx2vnni", "avx2", "scalar"}
    # the declared skip (tests/skips.py, from /proc/cpuinfo) and the kernel's own detection agree
    assert ("avx512vnni" in ISAS) == (not skips.NO_AVX512_VNNI.holds())


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=25, deadline=None)
@given(n16=st.integers(1, 12), groups=st.integers(1, 5), g=st.sampled_from([16, 32, 48, 64, 128, 256]),
       m=st.integers(1, 13),
       seed=st.integers(0, 2**16), bias=st.booleans(), f32=st.booleans())
def test_each_path_matches_the_dequantized_reference(isa, n16, groups, g, m, seed, bias, f32):
    """SQNR >= 38 dB: only the int8 rounding of the activations (per row and group) differs.

    Group sizes cover both int16 flush intervals of the AVX2 kernel (groups of 2 (mod 4) chunks of
    8 channels: 16, 48) and m covers its 4-row assembly path and the 1-3 row tails."""
    n, k = 16 * n16, g * groups
    q, s, z, gen = _layer(n, k, g, seed)
    w, sz = native.repack(q, s, z)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    if f32:
        x, b = x.float(), (b.float() if b is not None else None)
    got = native.linear(x, w, sz, g, b, isa)
    assert got.shape == (m, n) and got.dtype == x.dtype
    assert sqnr_db(reference_linear(x, q, s, z, b), got) >= 38.0


def test_the_linear_clock_counts_each_w4a8_call_and_its_time():
    """``linear_clock``: each of the two linear ops adds one call and some wall time; other ops add nothing."""
    q, s, z, _ = _layer(32, 256, 64, 0)
    w, sz = native.repack(q, s, z)
    x = torch.randn(1, 256, dtype=torch.bfloat16)
    codes = torch.randint(0, 256, (2, 32, 16, 4), dtype=torch.uint8)  # 32 x 256 in super-blocks
    sb = torch.zeros(2, 1, 320, dtype=torch.uint8)
    ns0, calls0 = native.linear_clock()
    native.linear(x, w, sz, 64)
    native.linear_super_blocks(x, codes, sb)
    ns1, calls1 = native.linear_clock()
    torch.mm(x, x.t())
    assert (calls1 - calls0, ns1 > ns0) == (2, True)
    assert native.linear_clock() == (ns1, calls1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [63, 64, 65, 130])
def test_prefill_row_counts_cross_the_row_tiles(isa, m):
    """Rows are taken in tiles of 64 per pass over the weights: each tile boundary, and a tail of
    2 rows after full 4-row steps, give the same rows as the rows computed one at a time."""
    q, s, z, gen = _layer(48, 256, 128, 11)
    w, sz = native.repack(q, s, z)
    x = torch.randn(m, 256, generator=gen)
    together = native.linear(x, w, sz, 128, None, isa)
    alone = torch.cat([native.linear(x[i:i + 1], w, sz, 128, None, isa) for i in range(m)])
    assert torch.equal(together, alone)
    assert sqnr_db(reference_linear(x, q, s, z), together) >= 38.0


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k, g", [(8960, 32), (4096, 128), (2080, 32)])
def test_a_decode_row_quantized_in_pieces_across_threads_gives_the_same_output(isa, k, g):
    """At M < threads, a long activation row is quantized in pieces, one per thread (down_proj,
    K = 8960); groups are independent, so row 0 of M = 1 must equal row 0 of a batch whose rows
    keep every thread busy (quantized whole). 2080 = 65 groups of 32: no piece count divides it."""
    q, s, z, gen = _layer(32, k, g, 5)
    w, sz = native.repack(q, s, z)
    x = torch.randn(4, k, generator=gen).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        alone = native.linear(x[:1], w, sz, g, None, isa)
        together = native.linear(x[:2], w, sz, g, None, isa)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone[0], together[0])
    assert sqnr_db(reference_linear(x[:1], q, s, z), alone) >= 38.0


def test_the_int16_sums_do_not_overflow_at_the_extremes():
    """Codes all 15 and activations all +-127 (the int8 extremes): each int16 lane of the AVX2
    kernel sums 4 products a chunk over 4 chunks, 16 * 15 * 127 = 30480 in magnitude, the bound
    it is designed to (< 32767). Every path must give the exact product."""
    n, k, g = 32, 256, 128
    q = torch.full((n, k), 15, dtype=torch.uint8)
    s = torch.full((n, k // g), 0.01, dtype=torch.bfloat16)
    z = torch.zeros(n, k // g, dtype=torch.bfloat16)
    w, sz = native.repack(q, s, z)
    x = torch.cat([torch.ones(4, k), -torch.ones(4, k)])  # quantized to +127 and -127 exactly
    for isa in ISAS:
        got = native.linear(x, w, sz, g, None, isa)
        assert torch.allclose(got, reference_linear(x, q, s, z), rtol=1e-5), isa


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "scalar"])
def test_vector_paths_agree_with_the_plain_cpp_path(isa):
    """Same integer sums, same float epilogue: differences are float summation order only."""
    q, s, z, gen = _layer(96, 512, 64, 3)
    w, sz = native.repack(q, s, z)
    x = torch.randn(7, 512, generator=gen)
    assert sqnr_db(native.linear(x, w, sz, 64, None, "scalar"), native.linear(x, w, sz, 64, None, isa)) >= 100.0


def test_float_zero_points_are_exact_inside_the_kernel():
    """Groups far from zero (large float zeros): still right, with no correction GEMM outside."""
    q, s, z, gen = _layer(64, 256, 32, 1, offset=3.0)
    assert z.float().abs().mean() > 1.0
    w, sz = native.repack(q, s, z)
    x = torch.randn(4, 256, generator=gen).to(torch.bfloat16)
    assert sqnr_db(reference_linear(x, q, s, z), native.linear(x, w, sz, 32)) >= 38.0


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("g", [16, 32, 48, 64, 128])
def test_every_dequantization_path_is_bit_exact(isa, g):
    """Each ISA's dequantization (AVX-512: 32 input channels a step where the group allows, else a chunk
    at a time) equals the reference rounded to bf16, for group sizes that are and are not multiples of 32."""
    q, s, z, _ = _layer(48, 384, g, 11)
    w, sz = native.repack(q, s, z)
    assert torch.equal(native.dequantize(w, sz, g, isa), dequantize(q, s, z, torch.bfloat16))


def test_dequantize_is_bit_exact_and_the_prefill_path_is_a_bf16_gemm_on_it():
    q, s, z, gen = _layer(48, 256, 64, 5)
    w, sz = native.repack(q, s, z)
    wd = native.dequantize(w, sz, 64)
    assert torch.equal(wd, dequantize(q, s, z, torch.bfloat16))
    x = torch.randn(20, 256, generator=gen).to(torch.bfloat16)
    b = torch.randn(48, generator=gen).to(torch.bfloat16)
    assert torch.equal(native.linear(x, w, sz, 64, b, dequant_min_rows=20), F.linear(x, wd, b))
    below = native.linear(x, w, sz, 64, b, dequant_min_rows=21)  # 20 rows < 21: the integer kernel
    assert not torch.equal(below, F.linear(x, wd, b))
    assert sqnr_db(F.linear(x, wd, b), below) >= 38.0


def _step(*rows):
    """vLLM's forward context of an engine step whose requests have these query lengths (rows)."""
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

    starts = torch.tensor([0, *itertools.accumulate(rows)], dtype=torch.int32)
    metadata = CPUAttentionMetadata(num_actual_tokens=int(starts[-1]), max_query_len=max(rows), query_start_loc=starts,
                                    max_seq_len=max(rows), seq_lens=torch.tensor(rows, dtype=torch.int32),
                                    block_table=torch.zeros(len(rows), 1, dtype=torch.int32),
                                    slot_mapping=torch.arange(int(starts[-1])), scheduler_metadata=None)
    return ForwardContext(no_compile_layers={}, attn_metadata={"model.layers.0.self_attn.attn": metadata},
                          slot_mapping={})


def test_the_prefill_path_is_chosen_per_sequence_of_the_engine_step():
    """C09: in a step of requests with 3, 20, 5 and 24 tokens (then 4 padding rows), from 16 rows
    on, the 20- and 24-token requests take the bf16 GEMM on their own rows and the others the W4A8
    kernel: each request's rows are bit-equal to the request run alone."""
    from vllm.forward_context import override_forward_context

    q, s, z, gen = _layer(48, 256, 64, 7)
    w, sz = native.repack(q, s, z)
    wd = native.dequantize(w, sz, 64)
    b = torch.randn(48, generator=gen).to(torch.bfloat16)
    rows = (3, 20, 5, 24)
    x = torch.randn(sum(rows) + 4, 256, generator=gen).to(torch.bfloat16)
    with override_forward_context(_step(*rows)):
        batched = native.linear(x, w, sz, 64, b, dequant_min_rows=16)
    r0 = 0
    for n, alone_rows in zip((*rows, 4), ((3,), (20,), (5,), (24,), None), strict=True):
        xr = x[r0:r0 + n]
        with override_forward_context(_step(*alone_rows) if alone_rows else None):
            alone = native.linear(xr, w, sz, 64, b, dequant_min_rows=16)
        assert torch.equal(batched[r0:r0 + n], alone), (r0, n)
        expected = F.linear(xr, wd, b) if n >= 16 else native.linear(xr, w, sz, 64, b)
        assert torch.equal(alone, expected), (r0, n)
        r0 += n
    # a step that does not describe the call's rows (more rows than it has): the call is one sequence
    with override_forward_context(_step(40, 40)):
        assert torch.equal(native.linear(x, w, sz, 64, b, dequant_min_rows=16), F.linear(x, wd, b))


def test_float16_activations_go_through_float32():
    """cpu_int4 accepts float16 models (CpuInt4Config.get_supported_act_dtypes)."""
    q, s, z, gen = _layer(64, 256, 32, 6)
    w, sz = native.repack(q, s, z)
    x = torch.randn(3, 256, generator=gen).half()
    got = native.linear(x, w, sz, 32)
    assert got.dtype == torch.float16
    assert sqnr_db(reference_linear(x.float(), q, s, z), got) >= 38.0


def test_leading_dimensions_and_zero_rows():
    q, s, z, gen = _layer(32, 128, 32, 2)
    w, sz = native.repack(q, s, z)
    x = torch.randn(2, 3, 128, generator=gen).to(torch.bfloat16)
    assert native.linear(x, w, sz, 32).shape == (2, 3, 32)
    assert native.linear(torch.empty(0, 128, dtype=torch.bfloat16), w, sz, 32).shape == (0, 32)


def test_bad_arguments_are_named():
    q, s, z, _ = _layer(32, 128, 32, 2)
    w, sz = native.repack(q, s, z)
    x = torch.randn(1, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="cannot run the 'avx9000' kernel"):
        native.linear(x, w, sz, 32, isa="avx9000")
    with pytest.raises(RuntimeError, match="x has K=64 but w was packed for K=128"):
        native.linear(torch.randn(1, 64, dtype=torch.bfloat16), w, sz, 32)
    with pytest.raises(RuntimeError, match="group_size 48 must be a positive multiple of 16"):
        native.linear(x, w, sz, 48)
    with pytest.raises(RuntimeError, match="x must be bfloat16 or float32"):
        torch.ops.omni_quant.w4a8_linear(x.half(), w, sz, 32)
    with pytest.raises(ValueError, match="N % 16 == 0"):
        native.repack(q[:24], s[:24], z[:24])
    with pytest.raises(RuntimeError, match=r"sz must be .* = \[2, 4, 2, 16\]"):  # same numel, wrong shape
        native.linear(x, w, sz.permute(0, 2, 1, 3).contiguous(), 32)
    for rows in (0, 1):  # the prefill path checks the bias too
        with pytest.raises(RuntimeError, match="bias has 1 elements, N=32"):
            native.linear(x, w, sz, 32, torch.ones(1, dtype=torch.bfloat16), dequant_min_rows=rows)
    with pytest.raises(TypeError, match="x must be floating point"):
        native.linear(torch.ones(1, 128, dtype=torch.int32), w, sz, 32)


def _packed(n, k, g):
    """Packed tensors of any shape, zeros (the checks run before the contents are read)."""
    return torch.zeros(n // 16, k // 8, 16, 4, dtype=torch.uint8), torch.zeros(n // 16, k // g, 2, 16,
                                                                               dtype=torch.bfloat16)


@pytest.mark.parametrize("isa", ["auto", "scalar"])
def test_degenerate_shapes_are_refused_before_any_arithmetic(isa):
    """K = 0 divided by zero in the linear ops (csrc/linear_ops.cpp; SIGFPE killed the process); N = 0, a group size
    of 0 or one not dividing K are refused as well, each by name, on the GEMM (both row paths) and on dequantization.
    Reaching the last line proves the process survived."""
    op = torch.ops.omni_quant
    x0 = torch.randn(3, 0, dtype=torch.bfloat16)
    for rows in (None, torch.tensor(1, dtype=torch.int64)):  # the integer kernel, the prefill path
        with pytest.raises(RuntimeError, match="K .input channels. must be positive, got K=0"):
            op.w4a8_linear(x0, *_packed(32, 0, 16), 16, None, isa, rows)
        with pytest.raises(RuntimeError, match=r"N .output channels. must be positive, got w of shape \[0, 16, 16,"):
            op.w4a8_linear(torch.randn(3, 128, dtype=torch.bfloat16), *_packed(0, 128, 32), 32, None, isa, rows)
        for g in (0, -16, 8, 20, 48, 512):
            with pytest.raises(RuntimeError, match=f"group_size {g} must be a positive multiple of 16, <= 256, "
                                                   "dividing K=128"):
                op.w4a8_linear(torch.randn(3, 128, dtype=torch.bfloat16), *_packed(32, 128, 32), g, None, isa, rows)
    with pytest.raises(RuntimeError, match="got K=0"):
        op.dequantize(*_packed(32, 0, 16), 16, isa)
    with pytest.raises(RuntimeError, match="N .output channels. must be positive"):
        op.dequantize(*_packed(0, 128, 32), 32, isa)
    with pytest.raises(RuntimeError, match="group_size 0 must be"):
        op.dequantize(*_packed(32, 128, 32), 0, isa)
    with pytest.raises(ValueError, match=r"x must be \[..., K\] with K > 0, got shape \(2, 3, 0\)"):
        native.linear(torch.randn(2, 3, 0), *_packed(32, 0, 16), 16, isa=isa)
    q, s, z, gen = _layer(32, 128, 32, 2)
    w, sz = native.repack(q, s, z)
    x = torch.randn(4, 128, generator=gen).to(torch.bfloat16)
    assert sqnr_db(reference_linear(x, q, s, z), native.linear(x, w, sz, 32, isa=isa)) >= 38.0  # still alive
    assert native.linear(torch.empty(0, 128), w, sz, 32, isa=isa).shape == (0, 32)  # M = 0 is fine


def test_repack_refuses_degenerate_shapes_and_mismatched_groups():
    q, s, z, _ = _layer(32, 128, 32, 2)
    for codes in (q[:0], q[:, :0]):
        with pytest.raises(ValueError, match="needs N > 0, K > 0"):
            native.repack(codes, s[:codes.shape[0]], z[:codes.shape[0]])
    for scales, zeros in ((s[:, :0], z[:, :0]), (s[:, :3], z[:, :3]), (s, z[:16]), (s[0], z[0]), (s[:16], z[:16])):
        with pytest.raises(ValueError, match="must both be \\[N=32, G\\] with G >= 1 groups dividing K=128"):
            native.repack(q, scales, zeros)
    assert not native.supports_shape(0, 128, 32) and not native.supports_shape(32, 0, 32)
    assert not native.supports_shape(32, 128, 0) and native.supports_shape(32, 128, 32)


def test_repack_refuses_codes_out_of_range_naming_the_first_and_the_count():
    """A 16 would spill into the neighbouring nibble of the packed byte."""
    q, s, z, _ = _layer(32, 128, 32, 2)
    bad = q.to(torch.int64).clone()
    bad[3, 5] = 16
    with pytest.raises(ValueError, match=r"codes must be integers 0..15: 1 position\(s\) out of range, "
                                         r"the first codes\[3, 5\] = 16"):
        native.repack(bad, s, z)
    bad[0, 7], bad[31, 127] = -1, 300
    with pytest.raises(ValueError, match=r"3 position\(s\) out of range, the first codes\[0, 7\] = -1"):
        native.repack(bad, s, z)
    for dtype in (torch.float32, torch.bool):
        with pytest.raises(ValueError, match=f"codes must be integers 0..15, got dtype {dtype}"):
            native.repack(q.to(dtype), s, z)
    native.repack(q.to(torch.int32), s, z)  # any integer dtype with codes in range


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def bounds_log(monkeypatch):
    """The records of logger vllm.omni_quant.runtime.batch_rows, with its log-once flag reset."""
    import vllm.logger  # noqa: F401  (vLLM's logging config resets the handlers of vllm.* loggers: before ours)

    from omni_quant.runtime import batch_rows

    monkeypatch.setattr(batch_rows, "_failure_logged", False)
    handler = _Records()
    logger = logging.getLogger("vllm.omni_quant.runtime.batch_rows")
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


def test_a_failure_reading_the_steps_sequences_is_logged_once_and_the_rows_are_one_sequence(monkeypatch, bounds_log):
    """The batch_rows read raising: the call's rows count as one sequence (the result of a call outside a
    step), and one warning names the reason, however many calls fail."""
    from vllm.forward_context import override_forward_context

    from omni_quant.runtime import batch_rows

    q, s, z, gen = _layer(48, 256, 64, 7)
    w, sz = native.repack(q, s, z)
    x = torch.randn(52, 256, generator=gen).to(torch.bfloat16)
    one_sequence = native.linear(x, w, sz, 64, dequant_min_rows=16)

    def broken():
        raise RuntimeError("query_start_loc moved")

    monkeypatch.setattr(batch_rows, "sequence_row_starts", broken)
    with override_forward_context(_step(3, 20, 5, 24)):
        for _ in range(3):
            assert torch.equal(native.linear(x, w, sz, 64, dequant_min_rows=16), one_sequence)
    assert len(bounds_log) == 1, [r.getMessage() for r in bounds_log]
    assert bounds_log[0].levelno == logging.WARNING
    assert "RuntimeError: query_start_loc moved" in bounds_log[0].getMessage()
    assert "logged once" in bounds_log[0].getMessage()


def test_a_malformed_answer_to_the_kernel_is_logged_once_too(monkeypatch, bounds_log):
    """What the linear ops (csrc/linear_ops.cpp) caught and dropped before: an exception from
    batch_rows.sequence_bounds, or an answer that is not a tuple of bounds 0..rows."""
    from omni_quant.runtime import batch_rows

    q, s, z, gen = _layer(48, 256, 64, 7)
    w, sz = native.repack(q, s, z)
    x = torch.randn(20, 256, generator=gen).to(torch.bfloat16)
    one_sequence = native.linear(x, w, sz, 64, dequant_min_rows=16)

    def raising(rows):
        raise KeyError("no step")

    for answer in (lambda rows: [0, rows], lambda rows: (0, 5), lambda rows: (0, "x", rows), raising):
        monkeypatch.setattr(batch_rows, "sequence_bounds", answer)
        assert torch.equal(native.linear(x, w, sz, 64, dequant_min_rows=16), one_sequence)
    assert len(bounds_log) == 1, [r.getMessage() for r in bounds_log]
    assert "sequence_bounds returned a list, not a tuple" in bounds_log[0].getMessage()
    monkeypatch.setattr(batch_rows, "_failure_logged", False)  # each kind of failure names itself
    for answer, what in ((lambda rows: (0, 5), "returned 2 bounds, not 0, ..., 20"),
                         (lambda rows: (0, "x", rows), "TypeError"), (raising, "KeyError: 'no step'")):
        monkeypatch.setattr(batch_rows, "sequence_bounds", answer)
        native.linear(x, w, sz, 64, dequant_min_rows=16)
        assert what in bounds_log[-1].getMessage()
        monkeypatch.setattr(batch_rows, "_failure_logged", False)


def test_inductor_calls_the_compiled_kernel_with_no_python_op():
    """The op is registered in C++ (TORCH_LIBRARY); inductor emits an extern call to it."""
    from torch._inductor.utils import run_and_get_code

    q, s, z, gen = _layer(64, 256, 32, 4)
    w, sz = native.repack(q, s, z)
    rows = torch.tensor(0, dtype=torch.int64)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.relu(native.linear(x, w, sz, 32, None, "auto", rows)), backend="inductor",
                       fullgraph=True, dynamic=True)
    x = torch.randn(5, 256, generator=gen).to(torch.bfloat16)
    got, codes = run_and_get_code(fn, x)
    code = "\n".join(codes)
    assert "omni_quant.w4a8_linear" in code
    assert torch.equal(got, torch.relu(native.linear(x, w, sz, 32)))
    rows.fill_(4)  # read at run time: the compiled graph now takes the prefill path for 5 rows
    assert torch.equal(fn(x), torch.relu(F.linear(x, native.dequantize(w, sz, 32))))
