"""Named recipes (--recipe): what each writes, what the loader reads back, and what is refused."""

import json

import pytest
from test_convert import write_checkpoint

from omni_quant.conversion.checkpoint import convert
from omni_quant.conversion.cli import main
from omni_quant.conversion.output import ConversionError
from omni_quant.conversion.recipes import RECIPES

LINEARS = 7  # q, k, v, o, gate, up, down of the one layer write_checkpoint makes


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_recipe_writes_the_widths_it_names(tmp_path, recipe):
    src = write_checkpoint(tmp_path / "src")
    convert(src, tmp_path / "dst", recipe=recipe)
    qc = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]
    report = json.loads((tmp_path / "dst" / "quantization_report.json").read_text())
    rows = {r["name"].split(" <- ")[0].rsplit(".", 1)[0]: r for r in report["tensors"]
            if r["bits"] and not r["action"].startswith("embedding")}
    chosen = RECIPES[recipe]
    assert len(rows) == LINEARS + 1 and report["recipe"] == qc["recipe"] == recipe
    # the input embedding at the recipe's body width (format 4), outside the linear layers' bits per weight
    assert report["embedding"]["quantized"] and report["embedding"]["bits"] == chosen.body_bits
    assert qc["embedding_modules"] == ["model.embed_tokens"]
    for module, row in rows.items():
        assert row["bits"] == chosen.bits_for(module), module
        assert row["group_size"] == (row["shape"][1] if row["bits"] == 8 else 32)  # 8-bit: one scale per row
    eight = sorted(m for m, r in rows.items() if r["bits"] == 8)
    assert sorted(set(qc.get("bits_per_module", {})) - {"model.embed_tokens"}) == eight
    in_sb = sorted(m for m, r in rows.items() if "super-blocks" in r["action"])
    # super-blocks where K is a multiple of 256 (here down_proj, K = 256), only in recipes that ask for them
    assert in_sb == (sorted(m for m, r in rows.items() if r["shape"][1] % 256 == 0) if chosen.super_blocks else [])
    assert sorted(set(qc.get("super_block_modules", [])) - {"model.embed_tokens"}) == in_sb
    assert qc["format_version"] == 4  # the quantized embedding; without it, see the test below
    assert sorted(set(qc["group_size_per_module"]) - {"model.embed_tokens"}) == sorted(set(rows) - set(eight))
    names = set()
    for f in (tmp_path / "dst").glob("*.safetensors"):
        from safetensors import safe_open
        with safe_open(str(f), framework="pt") as h:
            names |= set(h.keys())
    for m in eight:
        assert {f"{m}.qweight8", f"{m}.scales8"} <= names and f"{m}.qweight" not in names
    for m in in_sb:
        assert {f"{m}.{t}" for t in ("qweight", "sub_scales", "sub_mins", "super_scales", "super_mins")} <= names
        assert f"{m}.scales" not in names
    n_weights = sum(r["shape"][0] * r["shape"][1] for r in rows.values())
    assert report["bits_per_weight"] == pytest.approx(8 * sum(r["bytes_out"] for r in rows.values()) / n_weights)
    assert (4.6 if in_sb else 4.9) < report["bits_per_weight"] < 8.2


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_with_a_bf16_embedding_checkpoints_keep_the_oldest_format_that_holds_them(tmp_path, recipe):
    """--keep-bf16 embed_tokens: the format older readers take (1 all 4-bit per group, 2 with 8-bit layers,
    3 with super-blocks)."""
    src = write_checkpoint(tmp_path / "src")
    convert(src, tmp_path / "dst", recipe=recipe, keep_bf16=["embed_tokens"])
    qc = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]
    assert "embedding_modules" not in qc
    assert qc["format_version"] == (3 if qc.get("super_block_modules") else 2 if qc.get("bits_per_module") else 1), \
        "checkpoints without super-blocks stay readable by format-1/2 readers"


def test_unknown_recipe_and_8_bit_gptq_are_refused_and_nothing_is_written(tmp_path):
    src = write_checkpoint(tmp_path / "src")
    with pytest.raises(ConversionError, match="--recipe q5 is not one of default, q4, q4-head8, q8, q4k"):
        convert(src, tmp_path / "dst", recipe="q5")
    with pytest.raises(ConversionError, match="--format gptq holds 4-bit layers only"):
        convert(src, tmp_path / "dst", fmt="gptq", recipe="q8")
    with pytest.raises(ConversionError, match="super-blocks, which only --format cpu_int4 holds"):
        convert(src, tmp_path / "dst", fmt="gptq", recipe="q4k")
    assert not (tmp_path / "dst").exists()


def test_the_cli_takes_a_recipe_and_refuses_one_for_a_gguf_file(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "src")
    assert main(["convert", str(src), str(tmp_path / "dst"), "--recipe", "q4-head8"]) == 0
    assert json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]["recipe"] == "q4-head8"
    assert main(["convert", str(tmp_path / "x.gguf"), str(tmp_path / "g"), "--recipe", "q8"]) == 2
    assert "--recipe, --group-size" in capsys.readouterr().err


def test_the_loader_reads_widths_and_refuses_fused_members_of_different_widths():
    from omni_quant.runtime.config import CpuInt4Config

    cfg = CpuInt4Config.from_config({"group_size": 32, "format_version": 2,
                                     "bits_per_module": {"lm_head": 8, "model.layers.0.self_attn.q_proj": 8}})
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert cfg.bits_for("lm_head") == 8 and cfg.bits_for("model.layers.0.mlp.down_proj") == 4
    with pytest.raises(ValueError, match=r"members \['q_proj', 'k_proj', 'v_proj'\] .* different widths \[4, 8\]"):
        cfg.bits_for("model.layers.0.self_attn.qkv_proj")
    with pytest.raises(ValueError, match="8-bit modules need format_version 2"):
        CpuInt4Config.from_config({"group_size": 32, "format_version": 1, "bits_per_module": {"lm_head": 8}})
    with pytest.raises(ValueError, match=r"4- and 8-bit modules, the checkpoint says \[4, 6\]"):
        CpuInt4Config.from_config({"group_size": 32, "format_version": 2, "bits_per_module": {"lm_head": 6}})
    with pytest.raises(ValueError, match=r"format_version 5, this omni-quant reads \(1, 2, 3, 4\)"):
        CpuInt4Config.from_config({"group_size": 32, "format_version": 5})
    with pytest.raises(ValueError, match="super_block_modules must be a list of module names"):
        CpuInt4Config.from_config({"group_size": 32, "format_version": 3, "super_block_modules": "lm_head"})
    with pytest.raises(ValueError, match=r"\['lm_head'\] are both 8-bit"):
        CpuInt4Config.from_config({"group_size": 32, "format_version": 3, "super_block_modules": ["lm_head"],
                                   "bits_per_module": {"lm_head": 8}})
    with pytest.raises(ValueError, match="super-block modules need format_version 3"):
        CpuInt4Config.from_config({"group_size": 32, "format_version": 2, "super_block_modules": ["lm_head"]})
    cfg = CpuInt4Config.from_config({"group_size": 32, "format_version": 3,
                                     "super_block_modules": ["model.layers.0.self_attn.q_proj", "lm_head"]})
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert cfg.super_blocks_for("lm_head") and not cfg.super_blocks_for("model.layers.0.mlp.down_proj")
    with pytest.raises(ValueError, match="some members of .*qkv_proj.* in super-blocks and some per group"):
        cfg.super_blocks_for("model.layers.0.self_attn.qkv_proj")
