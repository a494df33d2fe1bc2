"""cpu_int4 weights mapped from disk in the kernel's layout: the layout cache (issue 31, item 3).

Without it every start reads the checkpoint's 4-bit tensors, repacks each layer into the layout of
the kernel chosen on this CPU and copies the result into anonymous memory (:mod:`omni_quant.runtime.huge_pages`):
the weights cost their size twice at load and are private to each process. With it
(``OMNI_MAPPED_WEIGHTS``, on by default), the first load writes the repacked layers of its shard into a
layout file (:mod:`omni_quant.format.layout_file`) and every later load maps that file read-only and uses
views of the mapping as the layers' parameters: file pages of the page cache, shared by every process
that maps the file (a server and a script, two workers of one host), no repack and no copy.

How it reaches vLLM (0.28), through the quantization method only:

- ``CpuInt4LinearMethod.create_weights`` calls :func:`adopt`. At the first layer of a model this opens
  the session: the checkpoint directory (``model_config.model``), the key, the file. When the file is
  valid and holds the layer, the layer gets the mapped tensors as its parameters, and its checkpoint
  parameters (``qweight``, ``scales``...) are replaced by empty placeholders whose ``weight_loader``
  discards what the model's ``load_weights`` hands it. safetensors maps the checkpoint lazily
  (``safe_open(...).get_tensor``), so those 4-bit tensors are never read from disk.
- ``process_weights_after_loading`` calls :func:`finish` after the layer was repacked (or adopted). When
  the last layer created is finished and some layer was repacked, the session writes the file
  (atomically) and moves every repacked layer onto the new mapping, which frees the anonymous copies: the
  first start ends where later ones begin.

Where the file lives: ``omni-layouts/`` inside the checkpoint directory when it is writable, else
``OMNI_LAYOUT_CACHE_DIR`` (default ``$XDG_CACHE_HOME/omni/layouts``, ``~/.cache/omni/layouts`` without
it), named by the checkpoint's real path. Loading looks in both, the checkpoint's first. The name says
the instruction set, the ``OMNI_INT4_KERNEL`` setting and the shard (tensor and pipeline rank), so two
machines or two settings sharing a directory do not overwrite each other; everything else that decides
the bytes is the key inside the file (:func:`layout_key`): a file whose key differs (the checkpoint
changed, a new kernel revision, another torch) is refused with one log line and written again.

The checkpoint's identity costs no hashing of weights: :func:`checkpoint_digest` hashes each safetensors
file's name, size, modification time (ns) and header (names, dtypes, shapes, offsets of its tensors),
and ``config.json``. Rewriting a checkpoint changes its files' times; a file edited in place with its
time set back would not be noticed.

Falls back to the copy (today's path) with one log line saying why when the checkpoint is not a local
directory, a file cannot be written in either place (read-only, full, no mapping on that file system),
or mapping fails.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_platform import envs
from omni_quant.format import layout_file
from omni_quant.format.layout_file import LayerEntry, LayoutRefused, MappedLayout
from omni_quant.kernels import w4a8 as native
from omni_quant.runtime import huge_pages, layout_guard

__all__ = ["DIR_NAME", "LAYOUT_PARAMS", "adopt", "checkpoint_digest", "finish", "layout_key", "report",
           "user_cache_dir"]

logger = logging.getLogger("vllm.omni_quant.layout")

DIR_NAME = "omni-layouts"
"""The layout files' directory inside a checkpoint directory (vLLM's loader globs only ``*.safetensors``,
``*.bin`` and ``*.pt`` at the top level: it never sees it)."""
LAYOUT_PARAMS = ("w4a8_weight", "w4a8_scales_zeros", "w4a8_super_blocks", "int4_weight", "int4_scales_zeros")
"""The parameters a repacked cpu_int4 layer keeps (``omni_quant.runtime.config.CpuInt4LinearMethod``)."""
_CHECKPOINT_PARAMS = ("qweight", "scales", "zeros", "sub_scales", "sub_mins", "super_scales", "super_mins")

_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_events: list[dict[str, Any]] = []  # what each session of this process did, for report()


def user_cache_dir() -> Path:
    """``OMNI_LAYOUT_CACHE_DIR``, else ``$XDG_CACHE_HOME/omni/layouts``, else ``~/.cache/omni/layouts``."""
    if envs.OMNI_LAYOUT_CACHE_DIR:
        return Path(envs.OMNI_LAYOUT_CACHE_DIR)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "omni" / "layouts"


def checkpoint_digest(ckpt: Path) -> str:
    """sha256 over the checkpoint's identity: per ``*.safetensors`` file (name order) its name, size,
    modification time in ns and header (8-byte length + JSON: every tensor's name, dtype, shape and
    offsets), then ``config.json``'s bytes. Reads a few KiB, not the weights.

    Raises:
        OSError: a file cannot be read.
    """
    h = hashlib.sha256()
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}|".encode())
        with open(f, "rb") as fh:
            head = fh.read(8)
            h.update(head)
            if len(head) == 8:
                h.update(fh.read(min(struct.unpack("<Q", head)[0], 100 << 20)))
    config = Path(ckpt) / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    return h.hexdigest()


def layout_key(digest: str, dtype: torch.dtype, shard: dict[str, int]) -> dict[str, Any]:
    """What decides the bytes of a layout file: the layout format, the checkpoint ``digest``, omni's kernel
    revision (``native.KERNEL_REVISION``), the instruction sets the kernel was chosen for
    (``native.best_isa``, ``native.super_block_isa``), torch's version (its int4 layout), the model's dtype
    (torch's int4 scales), ``OMNI_INT4_KERNEL`` and the worker's ``shard``."""
    return {"format": layout_file.FORMAT, "checkpoint_digest": digest, "kernel_revision": native.KERNEL_REVISION,
            "isa": native.best_isa() or "none", "super_block_isa": native.super_block_isa() or "none",
            "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."),
            "int4_kernel_setting": envs.OMNI_INT4_KERNEL, "shard": dict(shard)}


def _file_name(key: dict[str, Any]) -> str:
    s = key["shard"]
    return (f"{key['isa']}-{key['int4_kernel_setting']}-tp{s['tp_rank']}of{s['tp_size']}"
            f"-pp{s['pp_rank']}of{s['pp_size']}.layout")


def _discard(param: torch.Tensor, loaded: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """A placeholder's weight loader: the layer's weights come from its layout file."""


@dataclass
class _Session:
    """One model's load: its file, its key, the layers created and finished."""

    key: dict[str, Any] | None = None
    candidates: list[Path] = field(default_factory=list)  # where a file may be, in lookup order
    targets: list[Path] = field(default_factory=list)     # where to write one, in order of preference
    mapped: MappedLayout | None = None
    reason: str = ""                                       # why not mapped (the one log line)
    created: int = 0
    finished: int = 0
    repacked: dict[str, Any] = field(default_factory=dict)  # prefix -> weakref of a layer repacked here
    adopted: dict[str, Any] = field(default_factory=dict)
    done: bool = False


def _shard() -> dict[str, int]:
    from vllm.distributed import parallel_state as ps

    tp = ps._TP.world_size if ps._TP is not None else 1
    tpr = ps._TP.rank_in_group if ps._TP is not None else 0
    pp = ps._PP.world_size if ps._PP is not None else 1
    ppr = ps._PP.rank_in_group if ps._PP is not None else 0
    return {"tp_size": tp, "tp_rank": tpr, "pp_size": pp, "pp_rank": ppr}


def _open_session() -> _Session:
    s = _Session()
    if not envs.OMNI_MAPPED_WEIGHTS:
        s.reason = "off (OMNI_MAPPED_WEIGHTS=0)"
        return s
    from vllm.config import get_current_vllm_config_or_none

    vc = get_current_vllm_config_or_none()
    if vc is None:
        s.reason = "no model load under way (no current vLLM config)"
        return s
    model = getattr(vc.model_config, "model", None)
    if not model or not Path(model).is_dir():
        s.reason = f"the checkpoint {model!r} is not a local directory"
        return s
    ckpt = Path(model).resolve()
    try:
        s.key = layout_key(checkpoint_digest(ckpt), vc.model_config.dtype, _shard())
    except OSError as exc:
        s.reason = f"the checkpoint's files cannot be read ({exc})"
        return s
    name = _file_name(s.key)
    user = user_cache_dir() / f"{hashlib.sha256(str(ckpt).encode()).hexdigest()[:16]}-{name}"
    s.candidates = s.targets = [ckpt / DIR_NAME / name, user]
    refused = []
    for path in s.candidates:
        try:
            s.mapped = layout_file.open_layout(path, s.key)
        except FileNotFoundError:
            continue
        except LayoutRefused as exc:
            logger.info("omni-quant: layout file %s refused: %s; the layers are repacked and the file written again",
                        path, exc)
            refused.append(f"refused: {exc}")
            continue
        except OSError as exc:
            logger.info("omni-quant: layout file %s cannot be mapped (%s); the layers are repacked", path, exc)
            refused.append(f"cannot be mapped: {exc}")
            continue
        logger.info("omni-quant: cpu_int4 layers mapped from %s (%d layers, %.1f MiB of file pages shared "
                    "between processes; no repack)", path, len(s.mapped.layers), s.mapped.nbytes / 2**20)
        _events.append({"state": "mapped", "path": str(path), "layers": len(s.mapped.layers)})
        layout_guard.guard(path, s.mapped.ino)
        return s
    s.reason = f"the layout file {refused[0]}" if refused else "no layout file yet"
    return s


def _session(config: Any) -> _Session:
    s = _sessions.get(config)
    if s is None or s.done:
        s = _sessions[config] = _open_session()
    return s


def _expected(entry: LayerEntry, n: int, k: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The shapes and dtypes a layer of ``[n, k]`` keeps for the entry's kernel and scheme."""
    g = entry.group_size
    if entry.kernel == "native":
        out = {"w4a8_weight": ((n // 16, k // 8, 16, 4), torch.uint8)}
        if entry.layout == "super_blocks":
            out["w4a8_super_blocks"] = ((n // 16, k // 256, native.SB_BYTES), torch.uint8)
        else:
            out["w4a8_scales_zeros"] = ((n // 16, k // g, 2, 16), torch.bfloat16)
        return out
    return {"int4_weight": ((n, k // 2), torch.uint8), "int4_scales_zeros": ((k // g, n, 2), None)}


def _fits(entry: LayerEntry, n: int, k: int) -> str | None:
    """Why ``entry`` cannot be this ``[n, k]`` layer's, or None when it fits."""
    if entry.kernel not in ("native", "int4pack") or entry.layout not in ("groups", "super_blocks") \
            or entry.group_size <= 0 or k % entry.group_size:
        return f"kernel {entry.kernel!r}, scheme {entry.layout!r}, group {entry.group_size} cannot serve [{n} x {k}]"
    want = _expected(entry, n, k)
    if set(entry.tensors) != set(want):
        return f"tensors {sorted(entry.tensors)}, expected {sorted(want)}"
    for name, (shape, dtype) in want.items():
        t = entry.tensors[name]
        if tuple(t.shape) != shape or (dtype is not None and t.dtype != dtype):
            return f"{name} is {t.dtype} {tuple(t.shape)}, expected {dtype} {shape}"
    return None


def adopt(config: Any, layer: torch.nn.Module, prefix: str, n: int, k: int, log_choice) -> bool:
    """Give ``layer`` (created by ``CpuInt4LinearMethod.create_weights``, ``[n, k]``) its tensors from the
    session's layout file when the file holds it; count the layer either way.

    On adoption the layer's parameters are the mapped tensors, ``cpu_int4_kernel``, ``cpu_int4_super_blocks``
    and ``cpu_int4_group_size`` are the file's, ``cpu_int4_dequant_rows`` (native) is
    :func:`omni_quant.runtime.kernel_choice.choose`'s answer (``OMNI_INT4_DEQUANT_MIN_ROWS``, the measurement cache,
    else the row count the file recorded: no measurement), ``cpu_int4_mapped`` is True, and the checkpoint
    parameters are empty placeholders whose loader discards. ``log_choice(n, k, group_size, choice, layout)``
    logs the choice as a repack would.

    Returns:
        True when the layer was adopted; False when it is to be loaded and repacked as usual (no file, the
        file lacks this layer or holds it in another shape, or the kernel chosen now differs).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    from omni_quant.runtime.kernel_choice import choose

    s = _session(config)
    s.created += 1
    layer.cpu_int4_mapped = False
    entry = s.mapped.layers.get(prefix) if s.mapped is not None else None
    if entry is None:
        if s.mapped is not None:
            s.reason = f"the layout file lacks layer {prefix}"
        return False
    why = _fits(entry, n, k)
    if why is None:
        gs = 256 if entry.layout == "super_blocks" else entry.group_size
        choice = choose((n, k), gs, isinstance(layer, ParallelLMHead), lambda: entry.dequant_min_rows,
                        layout=entry.layout)
        if choice.kernel != entry.kernel:
            why = f"its kernel {entry.kernel} is not the one chosen now ({choice.kernel}: {choice.reason})"
    if why is not None:
        s.reason = f"layer {prefix} in the layout file does not fit: {why}"
        logger.info("omni-quant: %s; it is repacked and the file written again", s.reason)
        return False
    log_choice(n, k, entry.group_size, choice, entry.layout)
    for name in _CHECKPOINT_PARAMS:
        if name in layer._parameters:
            placeholder = torch.nn.Parameter(torch.empty(0, dtype=layer._parameters[name].dtype), requires_grad=False)
            placeholder.weight_loader = _discard
            layer.register_parameter(name, placeholder)
    for name, t in entry.tensors.items():
        layer.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
    layer.cpu_int4_kernel = entry.kernel
    layer.cpu_int4_super_blocks = entry.layout == "super_blocks"
    layer.cpu_int4_group_size = entry.group_size
    if entry.kernel == "native":
        layer.register_buffer("cpu_int4_dequant_rows", torch.tensor(choice.dequant_min_rows, dtype=torch.int64),
                              persistent=False)
    layer.cpu_int4_mapped = True
    s.adopted[prefix] = weakref.ref(layer)
    return True


def finish(config: Any, layer: torch.nn.Module, prefix: str) -> None:
    """``layer`` is ready (adopted, or repacked by ``process_weights_after_loading``): drop an adopted
    layer's placeholders; after the model's last layer, write the layout file if any layer was repacked and
    move the repacked layers onto its mapping."""
    s = _session(config)
    if getattr(layer, "cpu_int4_mapped", False):
        for name in _CHECKPOINT_PARAMS:
            if name in layer._parameters:
                delattr(layer, name)
    else:
        s.repacked[prefix] = weakref.ref(layer)
    s.finished += 1
    if s.finished >= s.created:
        s.done = True
        if s.repacked:
            _write(s)
        elif s.mapped is None:
            _events.append({"state": "copied", "reason": s.reason})


def _entry(layer: torch.nn.Module) -> LayerEntry:
    rows = getattr(layer, "cpu_int4_dequant_rows", None)
    return LayerEntry(layer.cpu_int4_kernel, "super_blocks" if layer.cpu_int4_super_blocks else "groups",
                      int(layer.cpu_int4_group_size), int(rows) if rows is not None else 0,
                      {n: p.data for n, p in layer.named_parameters(recurse=False) if n in LAYOUT_PARAMS})


def _write(s: _Session) -> None:
    """Write every layer of the model (repacked and adopted) into the first writable target, then move the
    repacked ones onto the mapping; on failure keep the copies and say why once."""
    if s.key is None:
        if s.reason.startswith("no model load"):  # a layer built outside an engine (a test): nothing to say
            return
        logger.info("omni-quant: cpu_int4 weights copied into memory, not mapped: %s", s.reason)
        _events.append({"state": "copied", "reason": s.reason})
        return
    layers = {p: ref() for p, ref in {**s.adopted, **s.repacked}.items()}
    if any(m is None for m in layers.values()):
        _events.append({"state": "copied", "reason": "a layer was freed before the model finished loading"})
        return
    entries = {p: _entry(m) for p, m in layers.items()}
    errors = []
    for path in s.targets:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            mapped = layout_file.write_layout(path, s.key, entries)
        except (OSError, ValueError) as exc:
            errors.append(f"{path.parent}: {exc}")
            continue
        for prefix, layer in layers.items():  # adopted ones too: the old file may be gone (replaced)
            for name, t in mapped.layers[prefix].tensors.items():
                layer.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
            layer.cpu_int4_mapped = True
        huge_pages.retire_arena()  # the copies' arena is unmapped once they are freed (now)
        where = f"; not writable: {'; '.join(errors)}" if errors else ""
        logger.info("omni-quant: cpu_int4 layers written to %s (%s%s; %d layers, %.1f MiB) and mapped from it; "
                    "later starts map it without repacking", path, s.reason, where, len(entries),
                    mapped.nbytes / 2**20)
        _events.append({"state": "written", "path": str(path), "layers": len(entries)})
        layout_guard.guard(path, mapped.ino)
        return
    why = "; ".join(errors)
    logger.info("omni-quant: cpu_int4 weights copied into memory, not mapped: no layout file could be written (%s)",
                why)
    _events.append({"state": "copied", "reason": f"not written: {why}"})


def _smaps(paths: set[str]) -> dict[str, int]:
    """Rss, Anonymous and FilePmdMapped (bytes) of this process's mappings of ``paths``, from /proc/self/smaps."""
    out = {"rss": 0, "anonymous": 0, "file_pmd_mapped": 0, "mappings": 0}
    fields = {"Rss:": "rss", "Anonymous:": "anonymous", "FilePmdMapped:": "file_pmd_mapped"}
    current = False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                name = line.split(None, 5)[5].strip() if len(parts) >= 6 else ""
                current = name.removesuffix(" (deleted)") in paths
                out["mappings"] += current
            elif current and parts and parts[0] in fields:
                out[fields[parts[0]]] += int(parts[1]) * 1024
    return out


def report() -> dict[str, Any]:
    """What the sessions of this process did (``events``: ``mapped`` or ``written`` with the file's path,
    or ``copied`` with the reason) and the resident pages of the layout files it maps (``smaps``: ``rss``,
    ``anonymous``, ``file_pmd_mapped`` in bytes, ``mappings``)."""
    paths = {e["path"] for e in _events if "path" in e}
    return {"events": list(_events), "smaps": _smaps(paths) if paths else None}
