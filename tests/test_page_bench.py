"""harness.kernels.pages: the A/B of decode's weight reads on 4 KiB and huge pages, on a tiny model."""

from __future__ import annotations

import json

import pytest

from harness import provenance
from harness.kernels import matrix as kernel_bench
from harness.kernels import pages as page_bench
from omni_quant.kernels import w4a8 as native
from skips import needs_kernel

pytestmark = needs_kernel


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(kernel_bench.SHAPES, "tiny", [("qkv_proj", 64, 256, 32), ("down_proj", 32, 512, 32),
                                                      ("lm_head", 96, 256, 32)])
    monkeypatch.setitem(page_bench.LAYERS, "tiny", 3)
    return "tiny"


def test_a_step_is_every_layer_then_the_head(tiny):
    weights = page_bench.step_weights(tiny)
    assert [k for k, _, _ in weights] == [256, 512] * 3 + [256]
    k, w, sb = weights[-1]
    assert tuple(w.shape) == (96 // 16, 256 // 8, 16, 4) and tuple(sb.shape) == (96 // 16, 1, native.SB_BYTES)


def test_a_model_without_super_blocks_is_refused_by_name():
    with pytest.raises(ValueError, match="smollm2-135m qkv_proj: K=576"):
        page_bench.step_weights("smollm2-135m")


def test_the_artifact_pairs_the_arms(tiny, tmp_path):
    out = tmp_path / "a.json"
    assert page_bench.main(["--model", tiny, "--steps", "4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "huge_pages_gemv" and data["linears_per_step"] == 7
    assert data["order"] == ["4k_pages", "huge_pages", "huge_pages", "4k_pages"] * 2
    assert len(data["samples_ms"]["4k_pages"]) == len(data["samples_ms"]["huge_pages"]) == 4
    ratio = data["summary"]["paired_ratio_huge_over_4k"]
    assert ratio["n"] == 4 and ratio["q1"] <= ratio["median"] <= ratio["q3"]
    assert data["provenance"]["cpu_flags"] == provenance.collect_cpu([])["cpu_flags"] and "labels" in data
    assert data["provenance"]["kernel_revision"] == native.KERNEL_REVISION
