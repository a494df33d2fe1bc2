"""cpu_int4 weights mapped from a layout file (omni_quant.runtime.layout_cache) in real engines on SmolLM2-135M:
the same greedy tokens and prompt log-probabilities as the copied path, eager and compiled; the weights
are file pages (smaps of the worker); a read-only checkpoint directory, a file of another kernel revision,
a truncated file and two processes loading at once."""

from __future__ import annotations

import json
import struct
import threading
from pathlib import Path

import pytest
from readonly_dir import read_only

from conftest import clean_env, run_engine
from omni_quant.format import layout_file

pytestmark = pytest.mark.engine

PROMPTS = ["Once upon a time", "def fibonacci(n):", "The capital of France is", "User: What is 2 + 2?\nAssistant:"]
LAYOUT = "omni-layouts"


def _config(model: Path, eager: bool = True) -> dict:
    return {"llm": {"model": str(model), "enforce_eager": eager, "max_num_seqs": 4, "max_model_len": 256},
            "prompts": PROMPTS, "max_tokens": 24, "prompt_logprobs": True}


def _env(**extra: str) -> dict[str, str]:
    # a fixed prefill switch: the copied and the mapped engine take the same path on every step
    return clean_env(VLLM_PLUGINS="omni", OMNI_INT4_DEQUANT_MIN_ROWS="6", **extra)


def _linked_checkpoint(src: Path, dst: Path) -> Path:
    """A checkpoint directory of symbolic links to ``src``'s files (not its layout files): its own place
    for layout files, the same weights."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).symlink_to(f)
    return dst


def _layout(run_result: dict) -> dict:
    (worker,) = run_result["workers"]
    return worker["extension_reports"]["quant"]["layout"]


def _same_outputs(a: dict, b: dict) -> None:
    assert a["token_ids"] == b["token_ids"], (a["texts"], b["texts"])
    assert a["prompt_logprobs"] == b["prompt_logprobs"]  # the same bytes through the same kernels: equal


@pytest.fixture(scope="module")
def copied(int4_model_dir, tmp_path_factory):
    """Today's path: OMNI_MAPPED_WEIGHTS=0 (repacked into anonymous memory at every start)."""
    ckpt = _linked_checkpoint(int4_model_dir, tmp_path_factory.mktemp("copied") / "ckpt")
    run = run_engine(_config(ckpt), _env(OMNI_MAPPED_WEIGHTS="0"))
    assert not (ckpt / LAYOUT).exists()
    return run


@pytest.fixture(scope="module")
def mapped_dir(int4_model_dir, tmp_path_factory) -> Path:
    return _linked_checkpoint(int4_model_dir, tmp_path_factory.mktemp("mapped") / "ckpt")


@pytest.fixture(scope="module")
def first_and_second(mapped_dir):
    """Two engines one after the other in one process: the first writes the layout file, the second maps it."""
    return run_engine({"runs": [_config(mapped_dir), _config(mapped_dir)]}, _env())


def test_the_copied_path_says_why_it_copied(copied):
    assert _layout(copied)["events"][-1] == {"state": "copied", "reason": "off (OMNI_MAPPED_WEIGHTS=0)"}
    assert "not mapped: off (OMNI_MAPPED_WEIGHTS=0)" in copied.log


def test_the_first_load_writes_the_file_and_later_loads_map_it(first_and_second, copied, mapped_dir):
    first, second = first_and_second["runs"]
    (path,) = (mapped_dir / LAYOUT).iterdir()
    layers = sum(first["workers"][0]["extension_reports"]["quant"]["layers"].values())
    assert _layout(first)["events"][-1] == {"state": "written", "path": str(path), "layers": layers}
    assert _layout(second)["events"][-1] == {"state": "mapped", "path": str(path), "layers": layers}
    assert first_and_second.log.count("omni-quant: cpu_int4 layers written to") == 1
    assert first_and_second.log.count(f"omni-quant: cpu_int4 layers mapped from {path}") == 1
    _same_outputs(first, copied)
    _same_outputs(second, copied)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


def test_the_mapped_weights_are_file_pages_not_anonymous_memory(first_and_second, copied, mapped_dir):
    """smaps of the worker: the layout file's mapping is resident (prefaulted) with no anonymous page; and
    the worker's RssAnon is lower than the copied engine's by most of the file's size."""
    (path,) = (mapped_dir / LAYOUT).iterdir()
    size = path.stat().st_size
    for run in first_and_second["runs"]:
        pages = _layout(run)["smaps"]
        assert pages["mappings"] >= 1 and pages["anonymous"] == 0, pages
        assert pages["rss"] >= 0.9 * size, (pages, size)
    saved = copied["workers"][0]["rss_anon"] - first_and_second["runs"][0]["workers"][0]["rss_anon"]
    print(f"RssAnon copied - mapped: {saved / 2**20:.1f} MiB; layout file {size / 2**20:.1f} MiB")
    assert saved >= 0.5 * size, (saved, size)


def _rewrite_key(path: Path, **changes) -> None:
    """Rewrite the layout file ``path`` with its own tensors under its key changed by ``changes``."""
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(16)[8:])[0]
        key = json.loads(f.read(length))["key"]
    mapped = layout_file.open_layout(path, key)
    layout_file.write_layout(path, {**key, **changes}, mapped.layers)


def test_a_file_of_another_kernel_revision_or_truncated_is_refused_and_written_again(mapped_dir, copied,
                                                                                     first_and_second):
    (path,) = (mapped_dir / LAYOUT).iterdir()
    _rewrite_key(path, kernel_revision=-1)
    run = run_engine(_config(mapped_dir), _env())
    assert f"layout file {path} refused: made for another kernel_revision (-1; this load needs" in run.log
    assert _layout(run)["events"][-1]["state"] == "written"
    _same_outputs(run, copied)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    run = run_engine(_config(mapped_dir), _env())
    assert f"layout file {path} refused:" in run.log and "truncated" in run.log.split("refused:")[1].splitlines()[0]
    assert _layout(run)["events"][-1]["state"] == "written"
    _same_outputs(run, copied)
    layout_file.open_layout(path, json.loads(path.read_bytes()[16:16 + struct.unpack("<Q", path.read_bytes()[8:16])[0]])
                            ["key"])  # complete again


def test_a_read_only_checkpoint_directory_uses_the_user_cache(int4_model_dir, tmp_path, copied):
    ckpt = _linked_checkpoint(int4_model_dir, tmp_path / "ckpt")
    cache = tmp_path / "user-cache"
    with read_only(ckpt):
        result = run_engine({"runs": [_config(ckpt), _config(ckpt)]}, _env(OMNI_LAYOUT_CACHE_DIR=str(cache)))
    first, second = result["runs"]
    (path,) = cache.iterdir()
    assert not (ckpt / LAYOUT).exists()
    assert _layout(first)["events"][-1]["state"] == "written" and _layout(first)["events"][-1]["path"] == str(path)
    assert _layout(second)["events"][-1]["state"] == "mapped" and _layout(second)["events"][-1]["path"] == str(path)
    assert f"; not writable: {ckpt}" in result.log  # the checkpoint's directory was tried first, and why it failed
    _same_outputs(first, copied)
    _same_outputs(second, copied)


def test_two_processes_loading_one_checkpoint_at_once(int4_model_dir, tmp_path, copied):
    """A server and a script starting together on a checkpoint without a layout file: both repack and write,
    one rename wins, both serve the same tokens, the file left is complete, no temporary file stays, and a
    third start maps it."""
    ckpt = _linked_checkpoint(int4_model_dir, tmp_path / "ckpt")
    results: list = [None, None]

    def start(i: int) -> None:
        results[i] = run_engine(_config(ckpt), _env())

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for run in results:
        assert run is not None
        assert _layout(run)["events"][-1]["state"] in ("written", "mapped")
        _same_outputs(run, copied)
    (path,) = (ckpt / LAYOUT).iterdir()
    third = run_engine(_config(ckpt), _env())
    assert _layout(third)["events"][-1] == {"state": "mapped", "path": str(path),
                                            "layers": _layout(third)["events"][-1]["layers"]}
    _same_outputs(third, copied)
    assert "omni W4A8 kernel" in third.log.split("mapped from")[-1]  # the kernel choice is logged when mapped too


def test_compiled_mapped_equals_compiled_copied(mapped_dir, first_and_second):
    """The compiled (default) mode on the mapped weights: the same tokens and log-probabilities as compiled on
    the copies (the only compiled test here: about a minute each on 2 cores)."""
    copied_c = run_engine(_config(mapped_dir, eager=False), _env(OMNI_MAPPED_WEIGHTS="0"))
    mapped_c = run_engine(_config(mapped_dir, eager=False), _env())
    assert _layout(copied_c)["events"][-1]["state"] == "copied"
    assert _layout(mapped_c)["events"][-1]["state"] == "mapped"
    _same_outputs(mapped_c, copied_c)


@pytest.mark.two_cores
def test_tensor_parallel_workers_map_one_file_each(tiny_llama, tmp_path):
    """tensor_parallel_size=2: each worker process writes, then maps, the layout file of its own shard; the
    tokens equal one worker's on the copies."""
    from omni_quant.conversion.checkpoint import convert

    ckpt = tmp_path / "ckpt"
    convert(tiny_llama, ckpt, group_size=64)  # row-parallel shards of K=128 are 64 wide under TP=2

    def config(tp: int) -> dict:
        return {"llm": {"model": str(ckpt), "enforce_eager": True, "skip_tokenizer_init": True,
                        "tensor_parallel_size": tp, "max_model_len": 256, "max_num_seqs": 4, "dtype": "float32"},
                "prompts": [[1, 17, 42, 99, 7], [1, 300, 5, 5, 5, 12, 400]], "max_tokens": 16}

    reference = run_engine(config(1), clean_env(VLLM_PLUGINS="omni", OMNI_MAPPED_WEIGHTS="0"))
    runs = run_engine({"runs": [config(2), config(2)]}, clean_env(VLLM_PLUGINS="omni"))["runs"]
    names = sorted(p.name for p in (ckpt / LAYOUT).iterdir())
    assert [n.split("-", 2)[2] for n in names] == ["tp0of2-pp0of1.layout", "tp1of2-pp0of1.layout"]
    for run, state in zip(runs, ("written", "mapped"), strict=True):
        assert len(run["workers"]) == 2
        paths = sorted(w["extension_reports"]["quant"]["layout"]["events"][-1]["path"] for w in run["workers"])
        assert paths == [str(ckpt / LAYOUT / n) for n in names]
        for w in run["workers"]:
            assert w["extension_reports"]["quant"]["layout"]["events"][-1]["state"] == state
            assert w["extension_reports"]["quant"]["layout"]["smaps"]["anonymous"] == 0
        assert run["token_ids"] == reference["token_ids"]
