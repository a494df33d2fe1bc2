"""Scale-out on CPU: tensor_parallel_size=2 on one NUMA node (OmniPlatform splits the CPUs among the
workers), pipeline_parallel_size=2 in one process tree and across two "nodes" on loopback (C17)."""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import clean_env, run_engine
from skips import FEWER_THAN_TWO_CPUS

pytestmark = [pytest.mark.engine, pytest.mark.two_cores]

PROMPTS = [[1, 17, 42, 99, 7], [1, 300, 5, 5, 5, 12, 400], [1, 2, 3]]


def _run(model, **parallel):
    config = {"llm": {"model": str(model), "enforce_eager": True, "skip_tokenizer_init": True,
                      "max_model_len": 256, "max_num_seqs": 4, "dtype": "float32", **parallel},
              "prompts": PROMPTS, "max_tokens": 24}
    return run_engine(config, clean_env(VLLM_PLUGINS="omni"))


@pytest.fixture(scope="module")
def one_rank(tiny_llama):
    """The tiny model on one rank: the reference of both the TP and the PP run (one engine, not two)."""
    return _run(tiny_llama)


@FEWER_THAN_TWO_CPUS.mark()
def test_tp2_greedy_equals_tp1(tiny_llama, one_rank):
    tp2 = _run(tiny_llama, tensor_parallel_size=2)
    assert len(tp2["workers"]) == 2
    cpus = [w["threads_cpus"] for w in tp2["workers"]]
    assert not set(cpus[0]) & set(cpus[1]), f"each worker has its own CPUs: {cpus}"
    assert set(cpus[0]) | set(cpus[1]) == os.sched_getaffinity(0), f"together they use every allowed CPU: {cpus}"
    assert tp2["token_ids"] == one_rank["token_ids"]


@FEWER_THAN_TWO_CPUS.mark()
def test_c17_pp2_greedy_equals_pp1(tiny_llama, one_rank):
    """pipeline_parallel_size=2 on CPU, eager (omni-patches' _patch_cpu_pipeline_parallel_eager):
    the same greedy tokens as one stage."""
    pp2 = _run(tiny_llama, pipeline_parallel_size=2)
    assert len(pp2["workers"]) == 2
    assert "pipeline stage 1: intermediate tensors" in pp2.log
    assert pp2["token_ids"] == one_rank["token_ids"]


def _serve(args: list[str], cpu: int, log: Path) -> subprocess.Popen:
    cmd = ["taskset", "-c", str(cpu), str(Path(sys.executable).with_name("omni-vllm")), "serve", *args]
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env=clean_env(VLLM_PLUGINS="omni"), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


@FEWER_THAN_TWO_CPUS.mark()
def test_c17_pp2_across_two_nodes_on_loopback(int4_model_dir, tmp_path):
    """Two "machines" on loopback, one CPU each: vLLM's own multi-node flags (docs/scale-out.md), node 0
    serves the API, node 1 is headless; greedy text equals one process serving the same model."""
    from harness.server_process import free_port, stop_group, wait_healthy

    model = str(int4_model_dir)
    common = [model, "--enforce-eager", "--max-model-len", "256", "--max-num-seqs", "2",
              "--served-model-name", "m"]
    port, master = free_port(), free_port()
    multi = ["--pipeline-parallel-size", "2", "--nnodes", "2", "--distributed-executor-backend", "mp",
             "--master-addr", "127.0.0.1", "--master-port", str(master)]
    node1 = _serve([*common, *multi, "--node-rank", "1", "--headless"], 1, tmp_path / "node1.log")
    node0 = _serve([*common, *multi, "--node-rank", "0", "--host", "127.0.0.1", "--port", str(port)], 0,
                   tmp_path / "node0.log")
    try:
        wait_healthy(node0, f"http://127.0.0.1:{port}/health", 900, tmp_path / "node0.log")
        assert node1.poll() is None, (tmp_path / "node1.log").read_text()[-3000:]
        two = _greedy(port)
    finally:
        stop_group(node0)
        stop_group(node1)
    single_port = free_port()
    one = _serve([*common, "--host", "127.0.0.1", "--port", str(single_port)], 0, tmp_path / "single.log")
    try:
        wait_healthy(one, f"http://127.0.0.1:{single_port}/health", 900, tmp_path / "single.log")
        single = _greedy(single_port)
    finally:
        stop_group(one)
    assert two == single and all(two), (two, single)
    assert "pipeline stage 1: intermediate tensors" in (tmp_path / "node1.log").read_text()


def _greedy(port: int) -> list[str]:
    out = []
    for prompt in ("Once upon a time", "The capital of France is"):
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 24, "temperature": 0.0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            out.append(json.loads(r.read())["choices"][0]["text"])
    return out
