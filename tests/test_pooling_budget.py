"""C30: an encoder-only embedding model cannot chunk its prefill, so its step budget must hold a whole
``max_model_len``. On a small machine omni's server default (``--max-num-batched-tokens 512``) was a parser
default, which vLLM takes for the user's choice and then refuses (``max_num_batched_tokens (512) is smaller than
max_model_len (1024)``); now vLLM's own default path gives omni's budget and raises it for such a model.

The model is a tiny random BERT (two layers) with SmolLM2's tokenizer: the behaviour under test is the
scheduler's budget, not the embeddings' quality."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import clean_env
from harness.server_process import free_port, log_tail, stop_group, wait_healthy

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tiny_bert(real_model, tmp_path_factory) -> Path:
    from transformers import BertConfig, BertModel

    out = tmp_path_factory.mktemp("tiny-bert")
    cfg = BertConfig(vocab_size=49152, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=1024, torch_dtype="float32")
    BertModel(cfg).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        if (real_model / name).exists():
            shutil.copy(real_model / name, out / name)
    return out


def test_c30_pooling_model_longer_than_the_small_step_budget_serves_embeddings(tiny_bert, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    cmd = [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(tiny_bert), "--runner", "pooling",
           "--max-model-len", "1024", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
           "--served-model-name", "bert"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=clean_env(VLLM_PLUGINS="omni"), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/health", 600, log)
        body = json.dumps({"model": "bert", "input": ["a short text", "word " * 900]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            data = json.loads(r.read())
    finally:
        stop_group(proc)
    # the second input (over 900 tokens) is longer than the small budget and was embedded in one step
    assert [len(d["embedding"]) for d in data["data"]] == [64, 64], log_tail(log)
    assert data["usage"]["prompt_tokens"] > 900
