"""cpu_int4 tensor math and packing: properties over shapes, group sizes and extremes."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from omni_quant.format.packing import pack, unpack
from omni_quant.format.quant_math import (
    GROUP_SIZES,
    GroupSizeError,
    choose_group_size,
    dequantize,
    quantize,
    reference_linear,
    sqnr_db,
)

shapes = st.tuples(st.integers(1, 24), st.sampled_from([32, 64, 96, 128, 192, 256, 576]))


@given(st.integers(1, 16), st.integers(1, 64).map(lambda h: 2 * h), st.integers(0, 2**31 - 1))
def test_pack_unpack_round_trip(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    packed = pack(q)
    assert packed.shape == (n, k // 2) and packed.dtype == torch.uint8
    assert torch.equal(unpack(packed), q)


def test_pack_refuses_codes_above_15():
    with pytest.raises(ValueError, match="0..15"):
        pack(torch.full((1, 2), 16, dtype=torch.uint8))


@given(shapes, st.sampled_from(GROUP_SIZES), st.sampled_from([1e-3, 1.0, 1e3]), st.integers(0, 2**31 - 1))
def test_error_bounded_by_half_a_step(shape, g, magnitude, seed):
    n, k = shape
    if k % g:
        g = choose_group_size(k, 128)
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * magnitude
    q, s, z = quantize(w, g, torch.float32, refine_steps=0)  # the plain min/max grid
    w2 = dequantize(q, s, z, torch.float32)
    step = s.repeat_interleave(g, dim=1)
    assert (w - w2).abs().le(step * 0.5 + 1e-6 * magnitude).all()


@given(shapes, st.sampled_from(GROUP_SIZES), st.integers(0, 2**31 - 1))
def test_refinement_never_increases_a_groups_error(shape, g, seed):
    n, k = shape
    if k % g:
        g = choose_group_size(k, 128)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))

    def group_err(refine):
        q, s, z = quantize(w, g, torch.bfloat16, refine_steps=refine)
        return (dequantize(q, s, z, torch.float32) - w).pow(2).reshape(n, k // g, g).sum(-1)

    assert (group_err(3) <= group_err(0) * (1 + 1e-5) + 1e-12).all()


@pytest.mark.parametrize("g", GROUP_SIZES)
def test_extremes_constant_zero_and_large_groups(g):
    w = torch.cat([torch.zeros(1, g), torch.full((1, g), 3.25), torch.full((1, g), -7e4),
                   torch.linspace(-6e4, 6e4, g).unsqueeze(0)])
    q, s, z = quantize(w, g, torch.float32)
    w2 = dequantize(q, s, z, torch.float32)
    assert torch.equal(w2[:3], w[:3]), "a constant group dequantizes to exactly its value"
    assert (w2[3] - w[3]).abs().max() <= (1.2e5 / 15) / 2 * 1.001


@pytest.mark.parametrize("value", [1000.5, 1e-5, -3.0e38, 1e-30])
def test_a_constant_group_in_bf16_storage_is_exact(value):
    """Breaker finding: the zero of a constant group was ``lo + 8 * 1``, rounded to bf16, which lost
    ``lo`` (1e-5 became 0, 1000.5 became 1000). Now the zero is ``lo`` itself."""
    w = torch.full((2, 32), value).to(torch.bfloat16).float()
    q, s, z = quantize(w, 32)
    assert (q == 8).all() and torch.equal(dequantize(q, s, z, torch.float32), w)


def test_weights_no_float_grid_holds_are_refused():
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize(torch.tensor([[1.0] * 31 + [float("nan")]]), 32)
    with pytest.raises(ValueError, match="float32 maximum"):  # hi - lo overflows float32
        quantize(torch.tensor([[-3e38, 3e38] + [0.0] * 30]), 32)


def test_sqnr_of_large_finite_values_is_finite_and_scale_free():
    """Breaker finding: squares of values near 1e30 overflow float32 sums (inf / inf = NaN)."""
    ref = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    approx = ref + 0.01 * torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    small, large = sqnr_db(ref, approx), sqnr_db(ref * 1e30, approx * 1e30)
    assert 35.0 < small < 45.0 and large == pytest.approx(small, abs=1e-6)
    assert sqnr_db(ref, ref) == float("inf") and sqnr_db(torch.zeros(3), torch.ones(3)) == float("-inf")
    assert math.isnan(sqnr_db(ref, torch.full_like(ref, float("nan"))))  # NaN fails every ">= floor" check


@pytest.mark.parametrize("g", GROUP_SIZES)
def test_sqnr_of_gaussian_weights_in_bf16_storage(g):
    w = torch.randn(256, 576 if 576 % g == 0 else 512, generator=torch.Generator().manual_seed(0))
    q, s, z = quantize(w, g)
    assert sqnr_db(w, dequantize(q, s, z, torch.float32)) > 17.0  # ~4 bits of signal


def test_c08_group_size_rule():
    assert choose_group_size(1536, 128) == 128
    assert choose_group_size(576, 128, "q_proj") == 64  # SmolLM2: 576 = 9 x 64
    assert choose_group_size(96, 128) == 32
    with pytest.raises(GroupSizeError, match="model.x.weight: K=100"):
        choose_group_size(100, 128, "model.x.weight")


def test_reference_linear_is_x_times_dequantized_transpose():
    w = torch.randn(8, 64)
    q, s, z = quantize(w, 32, torch.float32)
    x = torch.randn(3, 64)
    bias = torch.randn(8)
    torch.testing.assert_close(reference_linear(x, q, s, z, bias), x @ dequantize(q, s, z, torch.float32).T + bias)


@pytest.mark.parametrize("g", GROUP_SIZES)
def test_importance_weighting_lowers_the_weighted_error(g):
    """A few input channels carry most of the input's energy (as the output head's do): weighting
    by E[x_k^2] lowers the error of x @ W.T those channels cause, by at least a quarter over 20
    random matrices (each fit is greedy, so the gain is asserted in aggregate)."""
    plain = weighted_fit = 0.0
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        n, k = 16, 2 * g
        w = torch.randn(n, k, generator=gen)
        importance = torch.ones(k)
        importance[torch.randperm(k, generator=gen)[:4]] = 200.0

        def weighted(q, s, z, w=w, importance=importance):
            return float((importance * (dequantize(q, s, z, torch.float32) - w).pow(2)).sum())

        plain += weighted(*quantize(w, g))
        qi, si, zi = quantize(w, g, importance=importance)
        weighted_fit += weighted(qi, si, zi)
        assert int(qi.max()) <= 15 and si.dtype == torch.bfloat16 and si.shape == (n, k // g)
    assert weighted_fit < 0.75 * plain, (weighted_fit, plain)


def test_importance_of_the_wrong_shape_or_negative_is_refused():
    w = torch.randn(4, 64)
    with pytest.raises(ValueError, match=r"importance must be \[K=64\]"):
        quantize(w, 32, importance=torch.ones(32))
    with pytest.raises(ValueError, match="importance"):
        quantize(w, 32, importance=-torch.ones(64))


def test_rows_fitted_in_blocks_give_the_same_codes_as_one_fit(monkeypatch):
    """quantize() bounds its temporaries by fitting ROW_BLOCK rows at a time: rows are independent."""
    import omni_quant.format.quant_math as qm

    w = torch.randn(10, 64, generator=torch.Generator().manual_seed(3))
    imp = torch.rand(64, generator=torch.Generator().manual_seed(4))
    whole = qm.quantize(w, 32, importance=imp)
    monkeypatch.setattr(qm, "ROW_BLOCK", 3)
    blocked = qm.quantize(w, 32, importance=imp)
    assert all(torch.equal(a, b) for a, b in zip(whole, blocked, strict=True))
