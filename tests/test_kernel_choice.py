"""omni_quant.runtime.kernel_choice: the per-layer kernel, from measurement (cached) or the overrides."""

import json

import pytest
import torch

from omni_quant.format.quant_math import quantize
from omni_quant.kernels import w4a8 as native
from omni_quant.runtime import kernel_choice
from skips import needs_kernel


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.delenv("OMNI_INT4_KERNEL", raising=False)
    monkeypatch.delenv("OMNI_INT4_DEQUANT_MIN_ROWS", raising=False)
    monkeypatch.setattr(kernel_choice, "_memo", {})
    return tmp_path


class Measure:
    def __init__(self, rows):
        self.rows, self.calls = rows, 0

    def __call__(self):
        self.calls += 1
        return self.rows


@needs_kernel
def test_measured_once_then_cached_on_disk_for_the_next_process(isolated):
    m = Measure(128)
    first = kernel_choice.choose((64, 256), 32, False, m)
    assert (first.kernel, first.dequant_min_rows, first.reason) == ("native", 128, "measured now")
    assert kernel_choice.choose((64, 256), 32, False, m).dequant_min_rows == 128 and m.calls == 1
    kernel_choice._memo.clear()  # a new process: only the file remains
    again = kernel_choice.choose((64, 256), 32, False, m)
    assert m.calls == 1 and again.dequant_min_rows == 128 and again.reason.startswith("measured earlier")
    cache = json.loads((isolated / "omni" / "kernel_choice.json").read_text())
    [(key, rows)] = cache.items()
    assert rows == 128 and key.endswith("|64x256|g32") and torch.__version__ in key


@needs_kernel
@pytest.mark.parametrize("content", ["{not json", "[1, 2, 3]", "null", '"abc"'])
def test_a_corrupt_cache_file_is_measured_over(isolated, content):
    (isolated / "omni").mkdir()
    (isolated / "omni" / "kernel_choice.json").write_text(content)
    assert kernel_choice.choose((64, 256), 32, False, Measure(64)).reason == "measured now"
    assert list(json.loads((isolated / "omni" / "kernel_choice.json").read_text()).values()) == [64]


@needs_kernel
@pytest.mark.parametrize("value", [10**30, True, -5, 64.0, "64"])
def test_an_unusable_cached_value_is_measured_over(isolated, value):
    kernel_choice.choose((64, 256), 32, False, Measure(128))  # writes the key
    path = isolated / "omni" / "kernel_choice.json"
    key = next(iter(json.loads(path.read_text())))
    path.write_text(json.dumps({key: value}))
    kernel_choice._memo.clear()
    c = kernel_choice.choose((64, 256), 32, False, Measure(32))
    assert (c.dequant_min_rows, c.reason) == (32, "measured now")


@needs_kernel
def test_the_head_is_not_measured_and_never_takes_the_prefill_path():
    m = Measure(16)
    c = kernel_choice.choose((49152, 576), 32, True, m)
    assert (c.kernel, c.dequant_min_rows, m.calls) == ("native", 0, 0)


@needs_kernel
def test_overrides(monkeypatch):
    m = Measure(16)
    monkeypatch.setenv("OMNI_INT4_DEQUANT_MIN_ROWS", "0")
    assert kernel_choice.choose((64, 256), 32, False, m).dequant_min_rows == 0 and m.calls == 0
    monkeypatch.setenv("OMNI_INT4_KERNEL", "int4pack")
    assert kernel_choice.choose((64, 256), 32, False, m).kernel == "int4pack"
    monkeypatch.setenv("OMNI_INT4_KERNEL", "fastest")
    with pytest.raises(ValueError, match="OMNI_INT4_KERNEL='fastest': choose auto, native or int4pack"):
        kernel_choice.choose((64, 256), 32, False, m)


def test_falls_back_to_int4pack_where_the_kernel_cannot_run(monkeypatch):
    m = Measure(16)
    c = kernel_choice.choose((24, 256), 32, False, m)  # N not a multiple of 16
    assert c.kernel == "int4pack" and "does not fit" in c.reason and m.calls == 0
    monkeypatch.setenv("OMNI_INT4_KERNEL", "native")
    with pytest.raises(ValueError, match="OMNI_INT4_KERNEL=native: .*unset it to fall back"):
        kernel_choice.choose((24, 256), 32, False, m)
    monkeypatch.delenv("OMNI_INT4_KERNEL")
    monkeypatch.setattr(native, "_w4a8", None)  # as if built without the kernel
    monkeypatch.setattr(native, "_IMPORT_ERROR", "No module named 'omni_quant.kernels._w4a8'")
    c = kernel_choice.choose((64, 256), 32, False, m)
    assert c.kernel == "int4pack" and "not built" in c.reason and "_w4a8" in c.reason


@needs_kernel
def test_measurement_returns_a_calibration_row_count_or_zero():
    q, s, z = quantize(torch.randn(256, 512), 64, torch.bfloat16)
    w, sz = native.repack(q, s, z)
    rows = kernel_choice.measure_dequant_min_rows(
        lambda x, r: native.linear(x, w, sz, 64, dequant_min_rows=r), 512, rows=(16, 256))
    assert rows in (0, 16, 256)


def test_the_calibration_pairs_neighbouring_calls_so_a_hiccup_does_not_decide(monkeypatch):
    """ABBA order after one untimed call of each; a native call slowed tenfold (another process on a
    shared host) changes one pair's ratio, not the median."""
    clock, calls = [0.0], []
    monkeypatch.setattr(kernel_choice.time, "perf_counter", lambda: clock[0])

    def path(name, seconds):
        def run():
            calls.append(name)
            slow = 10.0 if name == "native" and calls.count("native") == 3 else 1.0
            clock[0] += seconds * slow
        return run

    ratio = kernel_choice._paired_ratio(path("native", 1.0), path("dequant", 0.8), pairs=5)
    assert ratio == pytest.approx(0.8)
    assert calls == ["native", "dequant"] + ["native", "dequant", "dequant", "native"] * 2 + ["native", "dequant"]


def _speculating(monkeypatch, k):
    import types

    import vllm.config

    config = types.SimpleNamespace(speculative_config=types.SimpleNamespace(num_speculative_tokens=k) if k else None)
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: config)


@needs_kernel
@pytest.mark.parametrize(("k", "measured", "want"), [(None, 16, 16), (24, 16, 26), (24, 25, 26), (24, 26, 26),
                                                     (24, 64, 64), (24, 0, 0), (4, 16, 16)])
def test_with_speculation_a_verify_step_never_takes_the_prefill_path(monkeypatch, k, measured, want):
    """A request's verify rows (1 + k) stay below the row count; the cache keeps what was measured."""
    _speculating(monkeypatch, k)
    assert kernel_choice.verify_rows() == (1 + k if k else 0)
    assert kernel_choice.choose((64, 256), 32, False, Measure(measured)).dequant_min_rows == want
    kernel_choice._memo.clear()
    _speculating(monkeypatch, None)
    assert kernel_choice.choose((64, 256), 32, False, Measure(-1)).dequant_min_rows == measured


@needs_kernel
def test_the_floor_holds_over_a_users_row_count_too(monkeypatch):
    _speculating(monkeypatch, 8)
    monkeypatch.setenv("OMNI_INT4_DEQUANT_MIN_ROWS", "4")
    choice = kernel_choice.choose((64, 256), 32, False, Measure(-1))
    assert choice.dequant_min_rows == 10 and "verify step's 9 rows" in choice.reason
