"""A GGUF file served as it is: converted once (:mod:`omni_quant.gguf_convert`) into a cache keyed by
the file's sha256 and the converter's version, reused while both are unchanged (``omni-vllm serve
FILE.gguf``): a new omni-quant whose converter writes a better checkpoint (the 4-bit input embedding of
``omni-quant-convert/6``) converts the file again instead of serving the old conversion."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

__all__ = ["cached_conversion", "resolve_model"]

logger = logging.getLogger("vllm.omni_quant.gguf")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    """``$VLLM_CACHE_ROOT/omni/gguf``."""
    from vllm import envs as vllm_envs

    return Path(vllm_envs.VLLM_CACHE_ROOT) / "omni" / "gguf"


def cached_conversion(gguf: Path, root: Path | None = None) -> Path:
    """The cpu_int4 checkpoint of ``gguf``: from the cache when this file (by digest) was converted
    before by this converter version, else converted now into it (atomically: an interrupted conversion
    leaves nothing; an older version's directory is left for the user to remove).

    Raises:
        omni_quant.convert.ConversionError: the file cannot be converted.
    """
    from omni_quant.convert import CONVERTER_VERSION
    from omni_quant.gguf_convert import convert_gguf

    digest = _sha256(gguf)
    version = CONVERTER_VERSION.rsplit("/", 1)[-1]
    out = (root or cache_root()) / f"{gguf.stem}-{digest[:16]}-c{version}"
    if (out / "config.json").is_file():
        logger.info("omni: %s (sha256 %s...) is served from its cpu_int4 conversion %s", gguf, digest[:16], out)
        return out
    logger.info("omni: converting %s (sha256 %s...) to cpu_int4 once, into %s", gguf, digest[:16], out)
    convert_gguf(gguf, out)
    logger.info("omni: %s converted; serving %s", gguf, out)
    return out


def resolve_model(arg: str) -> str | None:
    """``omni-vllm``'s model resolver: a path to an existing ``.gguf`` file -> its converted checkpoint."""
    path = Path(arg)
    if path.suffix != ".gguf" or not path.is_file():
        return None
    return str(cached_conversion(path))
