"""run-vllm's split of tg into the W4A8 GEMVs and the rest (``tg_gemv_ms``, ``tg_host_ms``), from the
clock readings alone; the real readings are checked end to end in tests/test_bench_e2e.py."""

import pytest

from harness.arms.vllm import _decode_split


def test_the_one_token_requests_gemv_time_is_taken_out_like_its_wall_time():
    one = (2_000_000, 113)  # T(1): 2 ms in the GEMVs
    gen = (2_000_000 + 127 * 20_000_000, 113 * 128)  # T(128): the same 2 ms plus 20 ms for each decode token
    c0 = (5_000, 7)  # the clock does not start at zero: only differences count
    c1 = (c0[0] + one[0], c0[1] + one[1])
    c2 = (c1[0] + gen[0], c1[1] + gen[1])
    got = _decode_split(127 * 0.027, c0, c1, c2, 127)  # T(128) - T(1): 27 ms a decode token
    assert got == pytest.approx({"tg_gemv_ms": 20.0, "tg_host_ms": 7.0})


def test_without_a_w4a8_call_there_is_no_split():
    assert _decode_split(3.4, (0, 0), (0, 0), (0, 0), 127) == {}
    assert _decode_split(3.4, (9, 1), (9, 1), (9, 1), 127) == {}
