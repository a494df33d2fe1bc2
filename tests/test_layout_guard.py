"""C37: the layout file a running ``omni-vllm serve`` maps is deleted, replaced or truncated in place
(omni_quant.runtime.layout_guard), on the real SmolLM2 int4 served eager from a checkpoint of its own:

- written in place (``dd conv=notrunc``: the size and header stay, so a start could not tell): the writer's open
  waits in the kernel while the server removes the file's name and exits with one line naming it; the write then
  lands in the removed file, and the next start writes the layout again and answers the same tokens (truncation
  breaks the same lease);
- replaced by rename, then deleted: the server keeps answering the same tokens from what it mapped."""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import clean_env
from omni_quant.format import layout_file

pytestmark = pytest.mark.engine

PROMPT = "The capital of France is"


def _linked_checkpoint(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).symlink_to(f)
    return dst


def _start(ckpt: Path, log: Path):
    from harness.server_process import Server

    def cmd(port: int) -> list[str]:
        return [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(ckpt), "--port", str(port),
                "--served-model-name", "m", "--enforce-eager", "--max-model-len", "512"]

    return Server.start(cmd, log, env=clean_env(VLLM_PLUGINS="omni"), timeout_s=600)


def _tokens(server) -> list:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 1}
    req = urllib.request.Request(server.base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["logprobs"]["tokens"]


def _key(path: Path) -> dict:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[8:16])
    return json.loads(raw[16:16 + length])["key"]


def test_a_layout_file_changed_under_a_running_server(int4_model_dir, tmp_path):
    ckpt = _linked_checkpoint(int4_model_dir, tmp_path / "ckpt")
    first = _start(ckpt, tmp_path / "first.log")
    try:
        (path,) = (ckpt / "omni-layouts").iterdir()
        log = first.log.read_text(errors="replace")
        assert f"layout file {path} guarded by a read lease" in log, log[-3000:]
        tokens = _tokens(first)
        size = path.stat().st_size
        done = threading.Event()
        t0 = time.monotonic()

        def overwrite() -> None:
            fd = os.open(path, os.O_WRONLY)  # blocks in the kernel until the server lets the file go
            try:
                os.pwrite(fd, os.urandom(1 << 20), size // 2)  # the weights' bytes, size and header kept
            finally:
                os.close(fd)
            done.set()

        threading.Thread(target=overwrite, daemon=True).start()
        first.proc.wait(timeout=120)  # the server ends itself
        assert done.wait(60), "the write never completed"
        waited = time.monotonic() - t0
    finally:
        first.stop()
    log = first.log.read_text(errors="replace")
    assert f"the layout file {path} was opened for writing or truncated by another process" in log, log[-3000:]
    assert "its mapping; the file is removed (a writer already holding it writes into the removed file)" in log
    assert not path.exists() and waited < 45, waited

    second = _start(ckpt, tmp_path / "second.log")
    try:
        log = second.log.read_text(errors="replace")
        assert f"cpu_int4 layers written to {path}" in log, log[-3000:]
        assert path.stat().st_size == size
        assert _tokens(second) == tokens
        # replaced by rename (what omni's own writer does): another complete file under another key
        key = _key(path)
        other = layout_file.open_layout(path, key)
        layout_file.write_layout(path, {**key, "kernel_revision": -1}, other.layers)
        assert _tokens(second) == tokens
        path.unlink()
        assert _tokens(second) == tokens
        assert second.proc.poll() is None
    finally:
        second.stop()
