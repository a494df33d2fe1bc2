"""``_patch_inductor_triton_key_cache``: the hash of Triton's files is computed once per Triton install, not per start.

Upstream behaviour (triton 3.x ``triton/runtime/cache.py``, ``triton_key``, which torch 2.13 reaches through
``torch/_inductor/runtime/triton_compat.py`` for inductor's cache keys, ``CacheBase.get_system`` and
``AsyncCompile``): every process that loads or compiles a graph hashes Triton's compiler, backend and language
sources and its ``libtriton.so`` (hundreds of MiB) with sha256, although vLLM's CPU graphs never run Triton
(cProfile of one compiled ``vllm.LLM`` warm start on SmolLM2 int4; docs/startup.md measures warm starts with and
without this patch and the SIMD probe cache).

The replacement keys the value by the installed Triton itself: its version and the relative path, size and
modification time (ns) of every file under the ``triton`` package directory (a walk of ~600 files, ~10 ms), the
rule ``make`` uses. The first process computes Triton's own value and stores it under
``$VLLM_CACHE_ROOT/omni_start_probes`` (:mod:`omni_patches.patches.probe_store`); later ones read it. A Triton
reinstalled, upgraded or edited in place changes a size or a time, hence the key, and the value is computed again.
It stays one value per process, as Triton's ``functools.lru_cache`` made it. A stored value not in Triton's own
form (its version, then sha256 digests) is computed again and replaced.
"""

from __future__ import annotations

import functools
import os
import re

from omni_patches.patches import MARKER, Patch, probe_store

__all__ = ["PATCH", "install_stamp"]

NAME = "_patch_inductor_triton_key_cache"
KIND = "triton_key"


def install_stamp(package_dir: str, version: str) -> str:
    """The store key of a Triton installed at ``package_dir``: sha256 over ``version`` and each file's relative
    path, size and modification time in ns (``__pycache__`` left out: Python writes it, Triton's hash reads the
    sources).

    Raises:
        OSError: ``package_dir`` cannot be listed.
    """
    files = []
    for root, dirs, names in os.walk(package_dir, onerror=_raise):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            st = os.stat(os.path.join(root, name))
            files.append((os.path.relpath(os.path.join(root, name), package_dir), st.st_size, st.st_mtime_ns))
    return probe_store.digest([version, files])


def _triton_form(value: str, version: str) -> bool:
    """Whether ``value`` has the form of Triton's ``triton_key``: the version, then sha256 hex digests joined by
    ``-`` (``triton/runtime/cache.py``)."""
    return re.fullmatch(re.escape(version) + r"[0-9a-f]{64}(-[0-9a-f]{64})*", value) is not None


def _raise(error: OSError) -> None:
    raise error


def _make(original):
    @functools.cache
    def triton_key() -> str:
        try:
            import triton

            key = install_stamp(os.path.dirname(os.path.abspath(triton.__file__)), triton.__version__)
        except (ImportError, OSError, AttributeError):
            return original()
        value = probe_store.load(KIND, key)
        if value is None or not _triton_form(value, triton.__version__):
            value = original()
            probe_store.save(KIND, key, value)
        return value

    functools.update_wrapper(triton_key, original)
    setattr(triton_key, MARKER, NAME)
    return [triton_key]


PATCH = Patch(
    name=NAME,
    targets={"torch._inductor.runtime.triton_compat:triton_key":
             "7d2c8021b5b5b005dc2a4457bc365b3d78ac10d2613df98d5bb216e343fe1140"},
    make=_make,
    disable_env="OMNI_PATCH_TRITON_KEY_CACHE_OFF",
    doc=__doc__.split("\n")[0],
    where=("`triton/runtime/cache.py:triton_key` as torch 2.13's "
           "`torch/_inductor/runtime/triton_compat.py` names it"),
    bug=("not a bug: every process that loads or compiles a graph hashes Triton's sources and its "
         "`libtriton.so`, although CPU graphs never run Triton; the "
         "replacement keeps the value under `$VLLM_CACHE_ROOT/omni_start_probes`, keyed by Triton's version "
         "and each of its files' size and modification time"),
    switch_doc="`OMNI_PATCH_TRITON_KEY_CACHE_OFF=1`",
    bug_test=("not a bug: "
              "`tests/test_patches_engine.py::test_aot_compile_cache_second_start_loads_instead_of_recompiling`"
              " (switched off: torch's own function, the same tokens)"),
    fix_test=("`tests/test_start_probes.py::test_the_triton_key_is_triton_s_own_and_read_back` (Triton's own value,"
              " stored by the first call, read back by a later one without computing)"),
)
