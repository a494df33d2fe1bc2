"""GGUF in (#11): the real SmolLM2 GGUF (Q4_1) converts directly, its 4-bit tensors keep their codes,
the chat template survives, bad files are named; `omni-vllm serve FILE.gguf` converts once and serves."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import clean_env
from omni_quant.conversion.output import ConversionError

OMNI_QUANT = str(Path(sys.executable).with_name("omni-quant"))


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    from harness.models.registry import gguf_path

    return gguf_path("smollm2-135m")


@pytest.fixture(scope="module")
def q4k_gguf(smollm2_gguf, tmp_path_factory) -> tuple[Path, dict]:
    """SmolLM2's GGUF with its ffn_down tensors (K = 1536) re-encoded as Q4_K, the other linears the
    file's own Q4_1; and the Q4_K fields written (:func:`_with_q4_k_ffn_down`)."""
    dst = tmp_path_factory.mktemp("q4k") / "smollm2-q4k.gguf"
    return dst, _with_q4_k_ffn_down(smollm2_gguf, dst)


@pytest.fixture(scope="module")
def converted(q4k_gguf, tmp_path_factory) -> Path:
    """That file converted once by `omni-quant convert FILE.gguf` (about a minute on two cores): the
    Q4_1 tests and the Q4_K test read the same output."""
    out = tmp_path_factory.mktemp("gguf") / "smollm2-int4"
    proc = subprocess.run([OMNI_QUANT, "convert", str(q4k_gguf[0]), str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_q4_1_tensors_are_repacked_with_their_codes(q4k_gguf, converted):
    from gguf import GGUFReader, dequantize
    from safetensors.torch import load_file

    from omni_quant.format.packing import unpack

    report = json.loads((converted / "quantization_report.json").read_text())
    assert report["source_format"] == "gguf" and report["architecture"] == "LlamaForCausalLM"
    assert report["paths"]["repacked"] >= 30 * 7, report["paths"]  # every decoder linear of the 30 layers
    tensors = {}
    for f in converted.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    reader = GGUFReader(str(q4k_gguf[0]))
    t = next(x for x in reader.tensors if x.name == "blk.3.ffn_up.weight")  # not permuted by llama.cpp
    assert t.tensor_type.name == "Q4_1"
    want = dequantize(np.asarray(t.data), t.tensor_type)
    codes = unpack(tensors["model.layers.3.mlp.up_proj.qweight"]).numpy()
    s = tensors["model.layers.3.mlp.up_proj.scales"].float().numpy()
    z = tensors["model.layers.3.mlp.up_proj.zeros"].float().numpy()
    got = (codes.astype(np.float32) - 8) * np.repeat(s, 32, 1) + np.repeat(z, 32, 1)
    # the codes are llama.cpp's; only the group constants were rounded to bf16 (8 significant bits)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 2 ** -7, err
    q = next(x for x in reader.tensors if x.name == "blk.3.attn_q.weight")  # permuted rows, undone exactly
    assert q.tensor_type.name == "Q4_1" and "model.layers.3.self_attn.q_proj.qweight" in tensors


def test_the_q8_0_embedding_is_kept_bit_for_bit(q4k_gguf, converted):
    """SmolLM2's token_embd is Q8_0: stored as 8-bit per group of 32 (int8 codes, float16 d as in the file), so its
    looked-up rows equal the gguf package's dequantization rounded to bf16 (the bf16 checkpoint's own table)."""
    import torch
    from gguf import GGUFReader, dequantize
    from safetensors.torch import load_file

    from omni_quant.runtime.embedding import lookup

    qc = json.loads((converted / "config.json").read_text())["quantization_config"]
    assert qc["embedding_modules"] == ["model.embed_tokens"] and qc["bits_per_module"]["model.embed_tokens"] == 8
    report = json.loads((converted / "quantization_report.json").read_text())
    assert report["embedding"]["scheme"] == "int8" and report["embedding"]["bytes"] == 49152 * (576 + 18 * 2)
    tensors = {}
    for f in converted.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    assert "model.embed_tokens.weight" not in tensors
    t = next(x for x in GGUFReader(str(q4k_gguf[0])).tensors if x.name == "token_embd.weight")
    assert t.tensor_type.name == "Q8_0"
    want = torch.from_numpy(dequantize(np.asarray(t.data), t.tensor_type)).to(torch.bfloat16)
    ids = torch.tensor([0, 1, 2, 100, 4000, 49151])
    got = lookup("int8", (tensors["model.embed_tokens.qweight8"], tensors["model.embed_tokens.scales8"]), ids,
                 torch.bfloat16)
    assert torch.equal(got, want[ids])


def test_config_tokenizer_and_chat_template_come_from_the_file(converted):
    from transformers import AutoTokenizer

    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "cpu_int4" and cfg["num_hidden_layers"] == 30
    tok = AutoTokenizer.from_pretrained(str(converted))
    assert tok.chat_template and "im_start" in tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user" in text


@pytest.mark.parametrize("case", ["truncated", "not_gguf", "missing"])
def test_bad_gguf_files_are_named_and_nothing_is_written(smollm2_gguf, tmp_path, case):
    from omni_quant.conversion.gguf_file import convert_gguf

    bad = tmp_path / "bad.gguf"
    if case == "truncated":
        bad.write_bytes(smollm2_gguf.read_bytes()[: 5 << 20])
    elif case == "not_gguf":
        bad.write_bytes(b"\x00" * 4096)
    dst = tmp_path / "out" / "dst"
    with pytest.raises(ConversionError, match="does not exist" if case == "missing" else "not a usable GGUF"):
        convert_gguf(bad, dst)
    assert not (tmp_path / "out").exists()


def test_a_nan_block_scale_is_named_before_calibration(smollm2_gguf, tmp_path):
    """Breaker finding: a GGUF whose block scale was NaN ended in a traceback from the calibration.
    The file's scales are read first; the error names the tensor and nothing is written."""
    from gguf import GGUFReader

    from omni_quant.conversion.gguf_file import convert_gguf

    t = next(x for x in GGUFReader(str(smollm2_gguf)).tensors if x.name == "blk.7.ffn_down.weight")
    assert t.tensor_type.name == "Q4_1"
    data = bytearray(smollm2_gguf.read_bytes())
    at = int(t.data_offset) + 20 * 3 + 2  # block 3's m (Q4_1: fp16 d, fp16 m, 16 bytes of codes)
    data[at:at + 2] = np.array([np.nan], dtype=np.float16).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    dst = tmp_path / "out" / "dst"
    with pytest.raises(ConversionError, match=r"blk\.7\.ffn_down\.weight \(Q4_1\) holds NaN or infinite values"):
        convert_gguf(bad, dst)
    assert not (tmp_path / "out").exists()


@pytest.mark.engine
def test_omni_vllm_serve_on_the_gguf_file_converts_once_and_answers_a_chat(smollm2_gguf, tmp_path):
    """The first start converts and answers a chat; the second, given the file as ``--model=FILE`` and its name
    as ``--served-model-name=NAME`` (C39: the ``=`` forms), finds the conversion in the cache and serves it under
    that name."""

    from harness.server_process import free_port, stop_group, wait_healthy

    port, cache = free_port(), tmp_path / "cache"
    logs = []
    for attempt in range(2):
        log = tmp_path / f"serve{attempt}.log"
        model = [str(smollm2_gguf)] if attempt == 0 else [f"--model={smollm2_gguf}", "--served-model-name=renamed"]
        cmd = [str(Path(sys.executable).with_name("omni-vllm")), "serve", *model, "--enforce-eager",
               "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512"]
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, env=clean_env(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(cache)), stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if attempt == 1:
                wait_healthy(proc, f"http://127.0.0.1:{port}/health", 900, log)
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60) as r:
                    assert [m["id"] for m in json.loads(r.read())["data"]] == ["renamed"]
                logs.append(log.read_text())
                continue
            wait_healthy(proc, f"http://127.0.0.1:{port}/health", 900, log)
            body = json.dumps({"model": smollm2_gguf.name, "max_tokens": 16, "temperature": 0.0,
                               "messages": [{"role": "user", "content": "What is the capital of France?"}]}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                reply = json.loads(r.read())["choices"][0]["message"]["content"]
        finally:
            stop_group(proc)
        assert reply.strip(), "a chat reply"
        print(f"chat reply from {smollm2_gguf.name}: {reply!r}")
        logs.append(log.read_text())
    assert "converting" in logs[0] and "to cpu_int4 once" in logs[0] and "converted to cpu_int4 in" in logs[0]
    # the conversion ran in a child interpreter, so the front end could fork its engine core (the default):
    # a front end that had run OpenMP itself would leave the forked engine core hanging before its first token
    assert "forks its engine core" in logs[0]
    assert "is served from its cpu_int4 conversion" in logs[1] and "to cpu_int4 once" not in logs[1]


def _with_q4_k_ffn_down(src: Path, dst: Path) -> dict[str, tuple]:
    """A copy of the GGUF ``src`` at ``dst`` whose ``ffn_down`` tensors (K = 1536) are re-encoded as Q4_K
    (fitted by omni_quant.format.super_blocks from their dequantized values, block bytes written as llama.cpp's
    block_q4_K); returns the fields written per tensor name."""
    import gguf
    from gguf_files import write_tensors, writer_like
    from test_super_blocks import _q4_k_bytes

    from omni_quant.format import super_blocks

    reader, writer = writer_like(src, dst)
    fields, tensors = {}, []
    for t in reader.tensors:
        raw, kind = np.asarray(t.data), t.tensor_type
        if t.name.endswith("ffn_down.weight"):
            import torch

            rows, cols = int(t.shape[1]), int(t.shape[0])
            w = torch.from_numpy(np.array(gguf.dequantize(raw, kind), dtype=np.float32).reshape(rows, cols))
            parts = [p.numpy() for p in super_blocks.quantize(w)]
            fields[t.name] = parts
            raw, kind = _q4_k_bytes(*parts).reshape(rows, -1), gguf.GGMLQuantizationType.Q4_K
        tensors.append((t.name, raw, kind))
    write_tensors(writer, tensors)
    return fields


def test_q4_k_tensors_become_super_blocks_bit_for_bit(q4k_gguf, converted):
    """A GGUF holding Q4_K (ffn_down, K = 1536) beside Q4_1 (the K = 576 layers): the Q4_K tensors are
    stored in super-blocks with llama.cpp's codes, scales, mins, d and dmin unchanged, and dequantize as
    the gguf package does; the Q4_1 ones stay per group (their exact form)."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf import dequantize as gguf_dequantize
    from safetensors.torch import load_file

    from omni_quant.format import super_blocks
    from omni_quant.format.packing import unpack

    q4k, fields = q4k_gguf
    qc = json.loads((converted / "config.json").read_text())["quantization_config"]
    assert qc["format_version"] == 4  # super-blocks and the quantized embedding
    assert sorted(qc["super_block_modules"]) == sorted(f"model.layers.{i}.mlp.down_proj" for i in range(30))
    report = json.loads((converted / "quantization_report.json").read_text())
    actions = {r["name"].split(" <- ")[0]: r["action"] for r in report["tensors"]}
    assert actions["model.layers.3.mlp.down_proj.weight"] == "repacked from Q4_K in super-blocks"
    assert actions["model.layers.3.mlp.up_proj.weight"] == "repacked from Q4_1"
    tensors = {}
    for f in converted.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    m = "model.layers.3.mlp.down_proj"
    got = (unpack(tensors[f"{m}.qweight"]), *(tensors[f"{m}.{n}"] for n in super_blocks.TENSORS[1:]))
    for a, b in zip(got, fields["blk.3.ffn_down.weight"], strict=True):
        assert np.array_equal(a.numpy(), b)
    t = next(x for x in GGUFReader(str(q4k)).tensors if x.name == "blk.3.ffn_down.weight")
    want = gguf_dequantize(np.asarray(t.data), GGMLQuantizationType.Q4_K).reshape(576, 1536)
    assert np.allclose(super_blocks.dequantize(*got).numpy(), want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_c31_serve_gguf_on_a_busy_port_fails_before_converting(smollm2_gguf, tmp_path):
    """C31: the port is checked before the GGUF is converted: one line naming it, nothing in the cache."""
    import socket

    cache = tmp_path / "cache"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        cmd = [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(smollm2_gguf), "--host", "127.0.0.1",
               "--port", str(port)]
        out = subprocess.run(cmd, env=clean_env(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(cache)), capture_output=True,
                             text=True, timeout=300)
    assert out.returncode != 0
    assert f"omni-vllm serve: port {port} on 127.0.0.1 is not free" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and not cache.exists()  # nothing converted, no cache made


def test_serve_port_check_reads_vllms_port_options():
    from omni_platform.vllm_cli import _check_serve_port, port_in_use

    with socket_held() as port:
        assert port_in_use("127.0.0.1", port)
        with pytest.raises(SystemExit, match=f"port {port} on 127.0.0.1 is not free"):
            _check_serve_port(["omni-vllm", "serve", "m", "--host=127.0.0.1", f"--port={port}"])
        _check_serve_port(["omni-vllm", "serve", "m", "--uds", "/tmp/x.sock", "--port", str(port)])  # a socket file
        _check_serve_port(["omni-vllm", "chat", "--port", str(port)])  # not serve
    with pytest.raises(SystemExit, match="'eighty' is not a port number"):
        _check_serve_port(["omni-vllm", "serve", "m", "--port", "eighty"])


def socket_held():
    import contextlib
    import socket

    @contextlib.contextmanager
    def held():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            yield s.getsockname()[1]

    return held()
