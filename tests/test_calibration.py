"""The output head's input importance (omni_quant.conversion.calibration) and the default recipe that uses it."""

import json

import pytest
import torch
from test_convert import write_checkpoint

from omni_quant.conversion.calibration import head_input_importance, linear_input_importance
from omni_quant.conversion.checkpoint import DEFAULT_GROUP_SIZE, convert


def test_importance_of_the_real_models_head_input(real_model):
    importance, how = head_input_importance(real_model)
    assert importance.shape == (576,) and importance.dtype == torch.float32  # SmolLM2-135M hidden size
    assert bool(torch.isfinite(importance).all()) and float(importance.min()) >= 0
    assert float(importance.max() / importance.mean()) > 10, "a few channels carry most of the energy"
    tokens = int(how.split(" over ")[1].split()[0])
    assert tokens >= 200, how


def test_every_linear_layer_of_the_real_model_gets_its_inputs_importance(real_model):
    found, how = linear_input_importance(real_model)
    assert len(found) == 30 * 7 + 1, "q, k, v, o, gate, up, down of 30 layers, and the head"
    assert found["model.layers.0.mlp.down_proj"].shape == (1536,)  # down's input is the FFN width
    assert found["model.layers.29.self_attn.q_proj"].shape == (576,)
    assert torch.equal(found["model.layers.3.self_attn.q_proj"], found["model.layers.3.self_attn.k_proj"])
    assert all(bool(torch.isfinite(v).all()) and float(v.min()) >= 0 for v in found.values())
    assert "211 linear layers" in how


def test_a_checkpoint_without_tokenizer_converts_with_an_unweighted_head_and_says_why(tmp_path):
    src = write_checkpoint(tmp_path / "src")
    importance, how = head_input_importance(src)
    assert importance is None and how.startswith("none: no tokenizer")
    convert(src, tmp_path / "dst")
    report = json.loads((tmp_path / "dst" / "quantization_report.json").read_text())
    assert report["importance"] == how
    assert report["group_size"] == DEFAULT_GROUP_SIZE == 32


def test_a_tensor_shaped_against_its_config_is_refused_and_nothing_is_written(tmp_path):
    """transformers finds the contradiction while building the model for calibration: exit 2 material."""
    from omni_quant.conversion.output import ConversionError

    src = write_checkpoint(tmp_path / "src", extra={"model.norm.weight": torch.ones(127)})  # hidden is 128
    with pytest.raises(ConversionError, match="contradicts config.json"):
        convert(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists() and not list(tmp_path.glob(".dst.partial-*"))


def test_a_weight_holding_nan_is_refused_by_name(tmp_path):
    from omni_quant.conversion.output import ConversionError

    bad = torch.randn(256, 128) * 0.05
    bad[3, 7] = float("nan")
    src = write_checkpoint(tmp_path / "src", extra={"model.layers.0.mlp.up_proj.weight": bad})
    with pytest.raises(ConversionError, match=r"model\.layers\.0\.mlp\.up_proj\.weight: holds NaN"):
        convert(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()
