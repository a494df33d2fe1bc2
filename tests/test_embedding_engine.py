"""The quantized input embedding in a real engine (issue 31, item 4): SmolLM2-135M converted from its GGUF keeps
token_embd in the file's Q8_0 and holds it so (no bf16 table), and greedy decoding equals the checkpoint that
keeps a bf16 embedding (`--keep-bf16 embed_tokens`): both tables give the same bf16 rows, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env, run_engine

pytestmark = pytest.mark.engine

OMNI_QUANT = str(Path(sys.executable).with_name("omni-quant"))
PROMPTS = ["Once upon a time", "The three primary colors are", "def fibonacci(n):", "The capital of France is",
           "To make a cup of tea,", "Photosynthesis is", "User: What is 2 + 2?\nAssistant:", "import numpy as np\n"]
VOCAB, HIDDEN = 49152, 576


@pytest.fixture(scope="module")
def bf16_embedding_dir(tmp_path_factory) -> Path:
    """The same GGUF converted with the embedding opt-out: the checkpoint as converter 5 wrote it."""
    from harness.models.registry import gguf_path

    out = tmp_path_factory.mktemp("smollm2-bf16-embedding") / "ckpt"
    proc = subprocess.run([OMNI_QUANT, "convert", str(gguf_path("smollm2-135m")), str(out), "--keep-bf16",
                           "embed_tokens"], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "input embedding: kept in bf16" in proc.stdout
    return out


@pytest.fixture(scope="module")
def runs(int4_model_dir, bf16_embedding_dir):
    """One process, three engines: the 4-bit-embedding checkpoint eager, the bf16-embedding one eager, and the
    4-bit-embedding one compiled (vLLM's default mode, the lookup traced by inductor)."""
    def config(model, eager):
        return {"llm": {"model": str(model), "enforce_eager": eager, "max_num_seqs": 8, "max_model_len": 512,
                        "max_num_batched_tokens": 512},
                "prompts": PROMPTS, "max_tokens": 32, "ledger": eager}

    run = run_engine({"runs": [config(int4_model_dir, True), config(bf16_embedding_dir, True),
                               config(int4_model_dir, False)]}, clean_env(VLLM_PLUGINS="omni"), timeout=1800)
    return run["runs"]


def test_the_embedding_is_held_in_its_stored_8_bit_form(int4_model_dir, runs):
    qc = json.loads((int4_model_dir / "config.json").read_text())["quantization_config"]
    assert qc["format_version"] == 4 and qc["embedding_modules"] == ["model.embed_tokens"]
    (worker,) = runs[0]["workers"]
    emb = worker["extension_reports"]["quant"]["embedding"]
    assert emb["scheme"] == "int8"
    assert emb["tensors"] == {"qweight8": ["int8", [VOCAB, HIDDEN]], "scales8": ["float16", [VOCAB, HIDDEN // 32]]}
    assert emb["resident_bytes"] == VOCAB * HIDDEN + VOCAB * HIDDEN // 32 * 2  # 30,081,024 bytes
    (ledger,) = runs[0]["ledgers"]
    bf16_table = VOCAB * HIDDEN * 2
    assert ledger["groups"]["embedding"]["bytes"] == emb["resident_bytes"] < 0.55 * bf16_table
    big_bf16 = [e for e in ledger["largest"] if e["dtype"] == "bfloat16" and e["bytes"] >= bf16_table]
    assert big_bf16 == [], big_bf16  # no bf16 table, for lookups nor for the (untied, 4-bit) head
    (old_ledger,) = runs[1]["ledgers"]
    assert old_ledger["groups"]["embedding"]["bytes"] == bf16_table
    assert runs[1]["workers"][0]["extension_reports"]["quant"]["embedding"] is None


def test_greedy_tokens_equal_the_bf16_embedding_checkpoint(runs):
    """The Q8_0 rows dequantized in float32 and rounded to bf16 are the bf16 table's rows: same logits, same
    tokens, every prompt, every position."""
    new, old = runs[0], runs[1]
    print("texts:", new["texts"])
    assert new["token_ids"] == old["token_ids"]
    assert all(len(t) == 32 or t[-1] == 2 for t in new["token_ids"])
    assert "Paris" in new["texts"][3]


def test_compiled_mode_runs_the_lookup(runs):
    """Compiled (inductor traces the lookup inside the model's graph): sensible text whose first tokens are the
    eager engine's (other ops' kernels differ between the modes, so later tokens may drift)."""
    compiled, eager = runs[2], runs[0]
    print("compiled texts:", compiled["texts"])
    assert compiled["workers"][0]["extension_reports"]["quant"]["embedding"]["scheme"] == "int8"
    first = sum(a[:4] == b[:4] for a, b in zip(compiled["token_ids"], eager["token_ids"], strict=True))
    assert first >= 6, (compiled["texts"], eager["texts"])
