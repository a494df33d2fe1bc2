"""``_patch_inductor_isa_probe_cache``: inductor's SIMD probe passes once per machine and toolchain, not per start.

Upstream behaviour (torch 2.13, ``torch/_inductor/cpu_vec_isa.py``, ``VecISA.check_build``, reached through
``valid_vec_isa_list`` and ``pick_vec_isa``): in every process that loads or compiles a graph, inductor checks each
instruction set the CPU reports (AMX, AVX-512 VNNI, AVX-512, AVX2) by building a small C++ file with that set's
flags (kept in inductor's cache) and ``dlopen``-ing the result in a new Python interpreter (``_probe_load``), so
that a compiler or CPU that cannot run it is found before a kernel uses it. On a 2-core AVX-512 EPYC a compiled
warm start ran six of those interpreters (cProfile of one ``vllm.LLM`` start on SmolLM2 int4) to learn what the
previous start had learned; docs/startup.md measures warm starts with and without this patch and the next.

The replacement stores each passed check under ``$VLLM_CACHE_ROOT/omni_start_probes``
(:mod:`omni_patches.patches.probe_store`), keyed by everything the check depends on: the instruction set and its
compiler flags, the probe's C++ source and its loader script, inductor's own dry-compile fingerprint (the compiler's
``-v`` output, the flags, the torch version), the interpreter and torch's library directory the probe loads
against, the CPU's flags (``/proc/cpuinfo``) and the kernel release (AMX needs the kernel's permission). A stored
pass answers True without building or probing; anything else (no entry, a failed check, a store that cannot be
read) runs torch's check, and only a pass is stored: a failure, which may be a probe that timed out on a loaded
machine, is checked again next time.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys

from omni_patches.patches import MARKER, Patch, probe_store

__all__ = ["PATCH", "cpu_flags", "probe_key"]

logger = logging.getLogger("vllm.omni_patches.isa_probe_cache")
NAME = "_patch_inductor_isa_probe_cache"
KIND = "isa"


@functools.cache
def cpu_flags() -> str:
    """The ``flags`` line of the first processor in ``/proc/cpuinfo`` ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.cache
def _toolchain(arch_flags: str, cxx_env: str | None, cxx_config: str) -> str:
    """Inductor's dry-compile fingerprint for ``arch_flags`` (the compiler's ``-v`` output, the flags, torch's
    version: one compiler run), once per process for each compiler choice (``CXX``, ``config.cpp.cxx``)."""
    from torch._inductor import cpu_vec_isa

    return cpu_vec_isa._get_isa_dry_compile_fingerprint(arch_flags)


def probe_key(isa, code: str) -> str | None:
    """The store key of ``isa.check_build(code)`` on this machine, or None when torch no longer has the helper
    the key is built from (then nothing is stored)."""
    import torch
    from torch._inductor import cpu_vec_isa

    loader = getattr(type(isa), "_avx_py_load", None)
    if not hasattr(cpu_vec_isa, "_get_isa_dry_compile_fingerprint") or loader is None:
        return None
    toolchain = _toolchain(isa.build_arch_flags(), os.environ.get("CXX"), repr(cpu_vec_isa.config.cpp.cxx))
    return probe_store.digest([
        type(isa).__name__, str(isa), isa.build_arch_flags(), hashlib.sha256(code.encode()).hexdigest(),
        hashlib.sha256(loader.encode()).hexdigest(), toolchain, sys.executable,
        os.path.dirname(torch.__file__), cpu_flags(), os.uname().release,
    ])


def _make(original):
    @functools.wraps(original)
    def check_build(self, code: str) -> bool:
        try:
            key = probe_key(self, code)
        except Exception as e:  # the key's inputs (the compiler's -v, /proc) unavailable: torch's own check
            logger.debug("omni-patches: no ISA probe key for %s (%s)", self, e)
            key = None
        if key is not None and probe_store.load(KIND, key) == "ok":
            return True
        ok = original(self, code)
        if ok and key is not None:
            probe_store.save(KIND, key, "ok")
        return ok

    setattr(check_build, MARKER, NAME)
    return [check_build]


PATCH = Patch(
    name=NAME,
    targets={"torch._inductor.cpu_vec_isa:VecISA.check_build":
             "3806b8a29a79fd41c0c7dd3ef7b8a15738dafc225c95bb4b8648b0639e5632ad"},
    make=_make,
    disable_env="OMNI_PATCH_ISA_PROBE_CACHE_OFF",
    doc=__doc__.split("\n")[0],
    where="torch 2.13's `torch/_inductor/cpu_vec_isa.py:VecISA.check_build`",
    bug=("not a bug: every process that loads or compiles a graph builds and `dlopen`s a probe per SIMD "
         "instruction set in a new Python interpreter; the "
         "replacement keeps each pass under `$VLLM_CACHE_ROOT/omni_start_probes`, keyed by the ISA, the "
         "compiler, torch, the interpreter, the CPU's flags and the kernel release"),
    switch_doc="`OMNI_PATCH_ISA_PROBE_CACHE_OFF=1`",
    bug_test=("not a bug: "
              "`tests/test_patches_engine.py::test_aot_compile_cache_second_start_loads_instead_of_recompiling` "
              "(switched off: the warm start runs the probes' interpreters again)"),
    fix_test="the same test (on: the warm starts run none, the cold one stored what it found)",
)
