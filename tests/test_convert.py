"""omni-quant convert: tiny synthetic checkpoints (C04, C08) and bad inputs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from omni_quant.conversion.checkpoint import convert
from omni_quant.conversion.output import ConversionError

OMNI_QUANT = str(Path(sys.executable).with_name("omni-quant"))


def write_checkpoint(path: Path, *, hidden=128, inter=256, vocab=512, layers=1, tied=True, with_head=False,
                     drop=(), dtype=torch.bfloat16, extra=None) -> Path:
    """A Llama checkpoint written tensor by tensor (no transformers), for converter tests."""
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    t = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g), "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in [("self_attn.q_proj", (hidden, hidden)), ("self_attn.k_proj", (hidden // 2, hidden)),
                            ("self_attn.v_proj", (hidden // 2, hidden)), ("self_attn.o_proj", (hidden, hidden)),
                            ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                            ("mlp.down_proj", (hidden, inter))]:
            t[p + name + ".weight"] = torch.randn(*shape, generator=g) * 0.05
        t[p + "input_layernorm.weight"] = torch.ones(hidden)
        t[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    if with_head:
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    t.update(extra or {})
    t = {k: v.to(dtype) if v.is_floating_point() else v for k, v in t.items() if k not in drop}
    save_file(t, str(path / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": layers, "vocab_size": vocab, "tie_word_embeddings": tied,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer_config.json").write_text("{}")
    return path


def _tensors(dst: Path) -> dict:
    out = {}
    for f in sorted(dst.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_c04_tied_head_is_quantized_by_default(tmp_path):
    src = write_checkpoint(tmp_path / "src", tied=True)
    convert(src, tmp_path / "dst")
    t = _tensors(tmp_path / "dst")
    assert {"lm_head.qweight", "lm_head.scales", "lm_head.zeros"} <= set(t)
    # the head quantized on its own beside the quantized embedding table (issue 31): no bf16 table at all
    assert "lm_head.weight" not in t and "model.embed_tokens.weight" not in t
    assert {"model.embed_tokens.qweight", "model.embed_tokens.scales", "model.embed_tokens.zeros"} <= set(t)
    cfg = json.loads((tmp_path / "dst" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "cpu_int4" and qc["bits"] == 4 and qc["modules_to_not_convert"] == []
    assert qc["converter_version"] and qc["group_size_per_module"]["lm_head"] == 32  # the default
    report = json.loads((tmp_path / "dst" / "quantization_report.json").read_text())
    head = [r for r in report["tensors"] if r["name"].startswith("lm_head")][0]
    assert head["action"] == "quantized" and head["sqnr_db"] > 15
    assert report["bits_per_weight"] == 5.0  # 4 bits + two bf16 per 32 weights
    assert (tmp_path / "dst" / "tokenizer_config.json").exists()


def test_c04_head_kept_in_bf16_only_when_named(tmp_path):
    src = write_checkpoint(tmp_path / "src", tied=True)
    convert(src, tmp_path / "dst", keep_bf16=["lm_head"])
    t = _tensors(tmp_path / "dst")
    assert not any(k.startswith("lm_head") for k in t)
    cfg = json.loads((tmp_path / "dst" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["quantization_config"]["modules_to_not_convert"] == ["lm_head"]


def test_c04_tied_config_that_also_carries_lm_head(tmp_path):
    src = write_checkpoint(tmp_path / "src", tied=True, with_head=True)
    convert(src, tmp_path / "dst")
    assert "lm_head.qweight" in _tensors(tmp_path / "dst")


def test_c04_untied_without_lm_head_names_it(tmp_path):
    src = write_checkpoint(tmp_path / "src", tied=False)
    with pytest.raises(ConversionError, match="lm_head"):
        convert(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def test_c08_k_not_multiple_of_128_gets_a_recorded_smaller_group(tmp_path):
    src = write_checkpoint(tmp_path / "src", hidden=192, inter=384)  # K=192 = 3 x 64
    convert(src, tmp_path / "dst", group_size=128)
    per = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]["group_size_per_module"]
    assert per["model.layers.0.self_attn.q_proj"] == 64 and per["model.layers.0.mlp.down_proj"] == 128


def test_c08_k_no_group_divides_is_refused_at_conversion(tmp_path):
    src = write_checkpoint(tmp_path / "src", hidden=144, inter=200)  # 200 is no multiple of 32
    with pytest.raises(ConversionError, match=r"down_proj: K=200"):
        convert(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("case", ["missing_dir", "no_config", "bad_json", "no_weights", "corrupt", "truncated",
                                  "int_dtype", "arch", "exists", "already_quantized", "null_quant_config",
                                  "gptq_quant_config"])
def test_bad_inputs_are_clear_and_leave_nothing(tmp_path, case):
    src = tmp_path / "src"
    dst = tmp_path / "out" / "dst"
    expect = {"missing_dir": "does not exist", "no_config": "config.json is missing",
              "bad_json": "not a readable JSON file",
              "no_weights": "no model.safetensors", "corrupt": "not a readable safetensors",
              "truncated": "not a readable safetensors", "int_dtype": "dtype torch.int32",
              "arch": "architecture BertModel is not a text generation model", "exists": "exists",
              "already_quantized": "already quantized",
              "null_quant_config": "quantization_config is null",  # C18
              "gptq_quant_config": "quant_method 'gptq'"}[case]
    if case != "missing_dir":
        write_checkpoint(src)
    if case == "no_config":
        (src / "config.json").unlink()
    elif case == "bad_json":
        (src / "config.json").write_text("{")
    elif case == "no_weights":
        (src / "model.safetensors").unlink()
    elif case == "corrupt":
        (src / "model.safetensors").write_bytes(b"\x00" * 100)
    elif case == "truncated":
        data = (src / "model.safetensors").read_bytes()
        (src / "model.safetensors").write_bytes(data[: len(data) // 3])
    elif case == "int_dtype":
        (src / "model.safetensors").unlink()
        shutil_src = tmp_path / "tmp2"
        write_checkpoint(shutil_src,
                         extra={"model.layers.0.mlp.gate_proj.weight": torch.ones(256, 128, dtype=torch.int32)})
        (shutil_src / "model.safetensors").rename(src / "model.safetensors")
    elif case == "arch":
        cfg = json.loads((src / "config.json").read_text())
        cfg["architectures"] = ["BertModel"]
        (src / "config.json").write_text(json.dumps(cfg))
    elif case == "exists":
        dst.mkdir(parents=True)
    elif case in ("already_quantized", "null_quant_config", "gptq_quant_config"):
        cfg = json.loads((src / "config.json").read_text())
        cfg["quantization_config"] = {"already_quantized": {"quant_method": "awq"}, "null_quant_config": None,
                                      "gptq_quant_config": {"quant_method": "gptq", "bits": 4}}[case]
        (src / "config.json").write_text(json.dumps(cfg))
    proc = subprocess.run([OMNI_QUANT, "convert", str(src), str(dst)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert expect in proc.stderr
    if case.endswith("quant_config"):  # one line naming the field, no traceback
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    leftovers = sorted(p.name for p in (tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else []
    assert leftovers == ([] if case != "exists" else ["dst"])
    if case == "exists":
        assert list(dst.iterdir()) == []


@pytest.mark.parametrize("case", ["config_list", "dst_inside_src", "keep_unknown", "keep_norm", "index_outside"])
def test_more_bad_inputs(tmp_path, case):
    src = write_checkpoint(tmp_path / "src")
    dst = tmp_path / "dst"
    args = []
    if case == "config_list":
        (src / "config.json").write_text('["LlamaForCausalLM"]')
        expect = "not a JSON object"
    elif case == "dst_inside_src":
        dst = src / "sub"
        expect = "inside the source"
    elif case == "keep_unknown":
        args = ["--keep-bf16", "no_such_proj"]
        expect = "matches no linear layer"
    elif case == "keep_norm":  # a norm is never quantized: keeping it would change nothing, silently
        args = ["--keep-bf16", "input_layernorm"]
        expect = "input_layernorm is not a linear layer"
    else:
        other = write_checkpoint(tmp_path / "other")
        (src / "model.safetensors").unlink()
        (src / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"x": str(Path("..") / other.name / "model.safetensors")}}))
        expect = "points outside the checkpoint"
    proc = subprocess.run([OMNI_QUANT, "convert", str(src), str(dst), *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
    if case.startswith("keep"):  # says how to name one: short or full checkpoint name
        assert "q_proj" in proc.stderr and "full checkpoint name (e.g. model.layers.0." in proc.stderr, proc.stderr
    assert not dst.exists()


def _shard(src: Path, extra_in_shard: dict | None = None, index_extra: dict | None = None) -> dict:
    """Split ``src``'s model.safetensors into two shards with an index; return the original tensors."""
    t = load_file(str(src / "model.safetensors"))
    (src / "model.safetensors").unlink()
    names = sorted(t)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for fname, keys in parts.items():
        shard = {k: t[k] for k in keys}
        if fname.startswith("model-00002"):
            shard.update(extra_in_shard or {})
        save_file(shard, str(src / fname))
        weight_map.update({k: fname for k in keys})
    weight_map.update(index_extra or {})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return t


def test_sharded_checkpoint_converts_only_what_the_index_lists(tmp_path):
    plain = write_checkpoint(tmp_path / "plain")
    convert(plain, tmp_path / "plain-int4")
    src = write_checkpoint(tmp_path / "src")
    stray = {"model.layers.0.self_attn.rotary_emb.inv_freq_stale": torch.ones(8)}
    _shard(src, extra_in_shard=stray)
    convert(src, tmp_path / "dst")
    got, want = _tensors(tmp_path / "dst"), _tensors(tmp_path / "plain-int4")
    assert set(got) == set(want), "a tensor the index does not list is not the model's"
    assert all(torch.equal(got[k], want[k]) for k in want), "sharding does not change the result"


def test_index_naming_a_tensor_its_shard_lacks_is_refused(tmp_path):
    src = write_checkpoint(tmp_path / "src")
    _shard(src, index_extra={"model.layers.0.mlp.extra_proj.weight": "model-00001-of-00002.safetensors"})
    dst = tmp_path / "dst"
    proc = subprocess.run([OMNI_QUANT, "convert", str(src), str(dst)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "model.layers.0.mlp.extra_proj.weight" in proc.stderr and "disagree" in proc.stderr
    assert not dst.exists() and [p.name for p in tmp_path.iterdir()] == ["src"]


def test_hugging_face_snapshot_with_symlinked_shards_converts(tmp_path):
    """A snapshot_download layout: snapshots/REV/* are symlinks into ../../blobs/."""
    src = write_checkpoint(tmp_path / "plain")
    _shard(src)
    snap = tmp_path / "models--x--y" / "snapshots" / "abc123"
    blobs = tmp_path / "models--x--y" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(src.iterdir())):
        (blobs / f"blob{i}").write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(Path("..", "..", "blobs", f"blob{i}"))
    convert(snap, tmp_path / "dst")
    assert "model.layers.0.mlp.down_proj.qweight" in _tensors(tmp_path / "dst")


@pytest.mark.parametrize("case", ["empty_index", "missing_layer", "duplicate_in_named_shard"])
def test_index_inventory(tmp_path, case):
    src = write_checkpoint(tmp_path / "src", layers=2)
    t = _shard(src)
    index = src / "model.safetensors.index.json"
    dst = tmp_path / "out" / "deeper" / "dst"
    if case == "empty_index":
        index.write_text(json.dumps({"weight_map": {}}))
        expect = "lists no tensors"
    elif case == "missing_layer":
        wm = json.loads(index.read_text())["weight_map"]
        index.write_text(json.dumps({"weight_map": {k: v for k, v in wm.items() if ".layers.1." not in k}}))
        expect = "no tensor of layer(s) [1]"
    else:  # the embedding sits in both shards; the index names the first: that is consistent
        shard = src / "model-00002-of-00002.safetensors"
        both = load_file(str(shard)) | {"model.embed_tokens.weight": t["model.embed_tokens.weight"]}
        save_file(both, str(shard))
        wm = json.loads(index.read_text())["weight_map"]
        wm["model.embed_tokens.weight"] = "model-00001-of-00002.safetensors"
        index.write_text(json.dumps({"weight_map": wm}))
        expect = None
    proc = subprocess.run([OMNI_QUANT, "convert", str(src), str(dst)], capture_output=True, text=True, timeout=300)
    if expect is None:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists(), "no directory of ours is left behind"


def test_a_failure_after_start_removes_the_parents_it_made(tmp_path, monkeypatch):
    """A refusal in the middle of the tensors (C08: down_proj's K=100 fits no group size), after
    the output directory exists and tensors were written into it: nothing of ours is left."""
    from omni_quant.conversion.output import ShardWriter

    src = write_checkpoint(tmp_path / "src", inter=100)
    written = []
    real_add = ShardWriter.add
    monkeypatch.setattr(ShardWriter, "add", lambda self, name, t: (written.append(name),
                                                                                 real_add(self, name, t))[1])
    dst = tmp_path / "new" / "dst"
    with pytest.raises(ConversionError, match="down_proj"):
        convert(src, dst)
    assert written, "the failure came after tensors were written"
    assert not (tmp_path / "new").exists(), "the output's parents, made by this run, are removed"


def test_c16_keeping_one_member_of_a_fused_layer_is_refused_with_its_partners(tmp_path):
    src = write_checkpoint(tmp_path / "src")
    proc = subprocess.run([OMNI_QUANT, "convert", str(src), str(tmp_path / "dst"), "--keep-bf16", "k_proj"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "fused qkv_proj (q_proj + k_proj + v_proj)" in proc.stderr and "missing q_proj, v_proj" in proc.stderr
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("keep", [["q_proj", "k_proj", "v_proj"], ["qkv_proj"]])
def test_c16_keeping_a_whole_fused_layer_by_either_name_keeps_every_member(tmp_path, keep):
    src = write_checkpoint(tmp_path / "src")
    convert(src, tmp_path / "dst", keep_bf16=keep)
    t = _tensors(tmp_path / "dst")
    for m in ("q_proj", "k_proj", "v_proj"):
        assert t[f"model.layers.0.self_attn.{m}.weight"].dtype == torch.bfloat16
        assert f"model.layers.0.self_attn.{m}.qweight" not in t
    assert "model.layers.0.self_attn.o_proj.qweight" in t
    qc = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]
    assert {"q_proj", "k_proj", "v_proj"} <= set(qc["modules_to_not_convert"])


def test_an_architecture_vllm_does_not_serve_is_named(tmp_path):
    src = write_checkpoint(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["TotallyNewForCausalLM"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=r"TotallyNewForCausalLM.*not one vLLM .* serves"):
        convert(src, tmp_path / "dst")


def test_the_loader_reads_the_group_sizes_recorded_per_module():
    """group_size_per_module is read back: a member's size for vLLM's fused layer, a recorded size over
    the preferred one, and members that disagree are refused."""
    from omni_quant.runtime.config import CpuInt4Config

    cfg = CpuInt4Config(group_size=128, group_size_per_module={
        "model.layers.0.self_attn.q_proj": 32, "model.layers.0.self_attn.k_proj": 32,
        "model.layers.0.self_attn.v_proj": 32, "model.layers.0.mlp.down_proj": 64,
        "model.layers.1.self_attn.q_proj": 32, "model.layers.1.self_attn.k_proj": 64})
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert cfg.group_size_for("model.layers.0.self_attn.qkv_proj", 256) == 32
    assert cfg.group_size_for("model.layers.0.mlp.down_proj", 512) == 64
    assert cfg.group_size_for("model.layers.0.mlp.up_proj", 256) == 128  # not recorded: the preferred size
    with pytest.raises(ValueError, match="different group sizes"):
        cfg.group_size_for("model.layers.1.self_attn.qkv_proj", 256)


def test_a_head_transformers_renames_is_found_by_its_checkpoint_name(tmp_path):
    """GPT-NeoX checkpoints call the head embed_out; transformers 5 renames it lm_head when it loads
    (conversion_mapping.py). The converter works in checkpoint names, and --keep-bf16 lm_head keeps it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from omni_quant.conversion.structure import model_structure

    cfg = AutoConfig.for_model("gpt_neox", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                               num_hidden_layers=1, vocab_size=256, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "src")
    structure = model_structure(tmp_path / "src", json.loads((tmp_path / "src" / "config.json").read_text()))
    assert structure.head == "embed_out" and "embed_out" in structure.linear and "lm_head" not in structure.linear
    convert(tmp_path / "src", tmp_path / "q")
    assert {"embed_out.qweight", "embed_out.scales"} <= set(_tensors(tmp_path / "q"))
    convert(tmp_path / "src", tmp_path / "kept", keep_bf16=["lm_head"])
    assert "embed_out.weight" in _tensors(tmp_path / "kept")
    qc = json.loads((tmp_path / "kept" / "config.json").read_text())["quantization_config"]
    assert "embed_out" in qc["modules_to_not_convert"]


def test_a_weight_no_float_scale_holds_is_refused_by_name(tmp_path):
    """Breaker finding: a group spanning -3e38..3e38 overflowed its float32 range to inf and was
    written with inf scales. Now refused, naming the tensor and the way out."""
    huge = torch.zeros(256, 128)
    huge[:, 0], huge[:, 1] = -3e38, 3e38
    src = write_checkpoint(tmp_path / "src", extra={"model.layers.0.mlp.gate_proj.weight": huge})
    with pytest.raises(ConversionError, match=r"gate_proj.*float32 maximum.*--keep-bf16"):
        convert(src, tmp_path / "out" / "dst", recipe="q4")
    assert not (tmp_path / "out" / "dst").exists()


def test_a_partial_output_left_by_a_killed_conversion_is_removed_by_the_next(tmp_path, caplog):
    """Breaker finding: SIGKILL left ``.DST.partial-*`` behind for good. The directory names its
    process; the next conversion to that DST removes those whose process is gone, not a live one's."""
    src = write_checkpoint(tmp_path / "src")
    out = tmp_path / "out"
    dead = out / ".dst.partial-999999999-abcd"  # above any Linux pid_max (4194304)
    live = out / f".dst.partial-{os.getpid()}-efgh"
    other = out / ".other.partial-999999999-ijkl"  # another DST's
    for d in (dead, live, other):
        d.mkdir(parents=True)
        (d / "model-00001.safetensors").write_bytes(b"x")
    with caplog.at_level("WARNING", logger="omni_quant.conversion.output"):
        convert(src, out / "dst", recipe="q4")
    assert not dead.exists() and live.exists() and other.exists()
    assert (out / "dst" / "config.json").exists()
    assert any(str(dead) in r.getMessage() for r in caplog.records)


def test_ctrl_c_anywhere_in_the_cli_is_one_line(monkeypatch, capsys):
    """Breaker finding: Ctrl-C while the CLI imported torch printed a traceback."""
    from omni_quant.conversion import cli

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", interrupted)
    assert cli.main(["convert", "a", "b"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["omni-quant: interrupted; nothing written"]


def test_a_config_transformers_refuses_is_named_in_one_line(tmp_path):
    """Breaker finding: num_attention_heads=7 (hidden 128) gave transformers' two-line validation error."""
    src = write_checkpoint(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_attention_heads"] = 7
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=r"attention heads \(7\)") as err:
        convert(src, tmp_path / "dst", recipe="q4")
    assert "\n" not in str(err.value)


def test_nan_in_a_copied_norm_is_refused_by_its_name(tmp_path):
    """Breaker finding: NaN in a layer norm was copied as it was (q4 recipe) or blamed on another tensor."""
    bad = torch.ones(128)
    bad[3] = float("nan")
    src = write_checkpoint(tmp_path / "src", extra={"model.layers.0.post_attention_layernorm.weight": bad})
    with pytest.raises(ConversionError, match=r"post_attention_layernorm.weight: holds NaN"):
        convert(src, tmp_path / "out" / "dst", recipe="q4")
    assert not (tmp_path / "out").exists()


def test_architectures_that_is_not_a_list_of_names_is_named(tmp_path):
    """Breaker finding: ``"architectures": 5`` raised a TypeError deep in the structure reader."""
    src = write_checkpoint(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = 5
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=r'"architectures" is 5; it must be a list'):
        convert(src, tmp_path / "dst", recipe="q4")
    cfg["architectures"] = []
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=r'config.json has no "architectures"'):
        convert(src, tmp_path / "dst", recipe="q4")


def test_a_file_that_is_neither_checkpoint_nor_gguf_is_named(tmp_path):
    (tmp_path / "junk").write_text("not a model")
    with pytest.raises(ConversionError, match="is a file but neither a checkpoint directory nor a GGUF file"):
        convert(tmp_path / "junk", tmp_path / "dst", recipe="q4")


def test_an_exact_all_zero_weight_keeps_the_report_strict_json(tmp_path):
    """Breaker finding: an all-zero weight has infinite SQNR, which json wrote as ``Infinity``."""
    src = write_checkpoint(tmp_path / "src", extra={"model.layers.0.self_attn.o_proj.weight": torch.zeros(128, 128)})
    convert(src, tmp_path / "dst", recipe="q4")
    text = (tmp_path / "dst" / "quantization_report.json").read_text()
    report = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    row = next(r for r in report["tensors"] if r["name"] == "model.layers.0.self_attn.o_proj.weight")
    assert row["action"] == "quantized" and row["sqnr_db"] is None
    assert report["min_sqnr_db"] is not None and report["min_sqnr_db"] < 100


@pytest.mark.parametrize("name", ["Model.GGUF", "no_suffix"])
def test_a_gguf_file_is_known_by_its_magic_or_any_case_suffix(tmp_path, name):
    """Breaker finding: ``.GGUF`` in capitals was taken for a checkpoint directory ("not a directory")."""
    from omni_quant.conversion.cli import _is_gguf

    f = tmp_path / name
    f.write_bytes(b"GGUF" + b"\x00" * 60)
    assert _is_gguf(str(f))
    d = tmp_path / "dir.gguf"
    d.mkdir()
    assert not _is_gguf(str(d)) and _is_gguf(str(tmp_path / "missing.Gguf"))
    (tmp_path / "plain").write_bytes(b"\x00" * 64)
    assert not _is_gguf(str(tmp_path / "plain"))


@pytest.mark.parametrize("how", [{"recipe": "q4"}, {"recipe": "q8"}, {"fmt": "gptq"}], ids=["q4", "q8", "gptq"])
def test_a_weight_whose_shape_config_json_contradicts_is_refused_under_every_recipe(tmp_path, how):
    """Breaker finding: a transposed or wrong-size weight converted with exit 0 under the recipes that
    do not calibrate (only the calibrated default noticed); vLLM then failed at load. Now refused by
    name, with both shapes, before anything is published."""
    down = torch.randn(256, 128) * 0.05  # config says [hidden=128, intermediate=256]: transposed
    src = write_checkpoint(tmp_path / "src", extra={"model.layers.0.mlp.down_proj.weight": down})
    with pytest.raises(ConversionError, match=r"down_proj.weight: shape \(256, 128\).*\(128, 256\).*transposed"):
        convert(src, tmp_path / "out" / "dst", **how)
    assert not (tmp_path / "out").exists()
    wide = torch.randn(128, 160) * 0.05  # another model's hidden size: not a transpose
    src2 = write_checkpoint(tmp_path / "src2", extra={"model.layers.0.self_attn.o_proj.weight": wide})
    with pytest.raises(ConversionError, match=r"o_proj.weight: shape \(128, 160\).*\(128, 128\)") as err:
        convert(src2, tmp_path / "out2" / "dst", **how)
    assert "transposed" not in str(err.value) and not (tmp_path / "out2").exists()


def test_sigterm_during_a_conversion_removes_the_partial_output(tmp_path):
    """Breaker finding: SIGTERM left ``.DST.partial-*`` behind with no message. A real SIGTERM to a
    real CLI process, sent while its tensors are being written (the writer is held at its first
    tensor until the signal comes): one line, exit 143, no DST, no partial."""
    import signal
    import time

    src = write_checkpoint(tmp_path / "src")
    ready = tmp_path / "writing"
    script = _held_at_first_tensor(ready)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", script, "convert", str(src), str(out / "dst"), "--recipe", "q4"],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), "the conversion never reached its first tensor"
    assert [p.name for p in out.iterdir()][0].startswith(".dst.partial-"), "the partial output exists now"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == f"omni-quant: terminated (SIGTERM); nothing written at {out / 'dst'}"
    assert not out.exists(), list(out.iterdir())


def _held_at_first_tensor(ready: Path) -> str:
    """A CLI run whose writer waits at its first tensor (so a signal lands mid-conversion)."""
    return ("import sys, time, pathlib\n"
            "from omni_quant.conversion import cli, output\n"
            "real = output.ShardWriter.add\n"
            "def add(self, name, t):\n"
            f"    pathlib.Path({str(ready)!r}).touch()\n"
            "    time.sleep(60)\n"
            "    return real(self, name, t)\n"
            "output.ShardWriter.add = add\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")


def test_c38_sigkill_mid_conversion_then_a_restart_converts_from_nothing(tmp_path):
    """A real SIGKILL (nothing can clean up) while tensors are written: the partial directory stays, naming the
    dead process; the next conversion removes it and writes the whole checkpoint."""
    import signal
    import time

    src, ready, out = write_checkpoint(tmp_path / "src"), tmp_path / "writing", tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", _held_at_first_tensor(ready), "convert", str(src),
                             str(out / "dst"), "--recipe", "q4"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), "the conversion never reached its first tensor"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    (partial,) = [p for p in out.iterdir()]
    assert partial.name.startswith(".dst.partial-") and not (out / "dst").exists()
    again = subprocess.run([sys.executable, "-m", "omni_quant.conversion.cli", "convert", str(src), str(out / "dst"),
                            "--recipe", "q4"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [p.name for p in out.iterdir()] == ["dst"] and (out / "dst" / "config.json").is_file()


def test_c38_a_full_disk_is_one_line_naming_the_directory_and_leaves_nothing(tmp_path):
    """The conversion's writes fail for want of room (a file size limit, ``ulimit -f``: EFBIG, as a full disk gives
    ENOSPC): one line naming the directory, what ran out and the space needed; no DST, no partial directory."""
    import resource
    import signal

    src = write_checkpoint(tmp_path / "src", hidden=256, inter=512, vocab=4096, layers=2)
    out = tmp_path / "out"

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))

    proc = subprocess.run([sys.executable, "-m", "omni_quant.conversion.cli", "convert", str(src), str(out / "dst"),
                           "--recipe", "q4"], capture_output=True, text=True, timeout=600, preexec_fn=small_files)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"{out}: a file size limit was reached" in lines[0] and "needs up to" in lines[0], lines[0]
    assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())
