"""``_patch_cpu_release_memory_after_load``: give freed heap back to the OS after load and warm-up.

Upstream behaviour (vLLM 0.28.0, ``vllm/v1/worker/gpu_worker.py`` ``Worker.load_model``,
``vllm/v1/worker/cpu_worker.py`` ``CPUWorker.determine_available_memory``, which warms the
model up): temporaries of weight loading and warm-up are freed to the allocator but stay
resident in the worker. After each, the replacement asks the allocator to return free
memory: tcmalloc's ``MallocExtension_ReleaseFreeMemory`` when tcmalloc is loaded (vLLM
preloads it on CPU), and glibc's ``malloc_trim(0)`` (man 3 malloc_trim); it logs the MiB
of RssAnon returned.
"""

from __future__ import annotations

import ctypes
import functools
import logging

from omni_patches.patches import MARKER, Patch
from omni_platform.procfs import status_bytes

__all__ = ["PATCH", "release_free_memory"]

logger = logging.getLogger("vllm.omni_patches.release_memory")
NAME = "_patch_cpu_release_memory_after_load"


def release_free_memory() -> int:
    """Return free allocator memory to the OS; bytes of RssAnon released (may be 0)."""
    before = status_bytes("RssAnon")
    proc = ctypes.CDLL(None)
    release = getattr(proc, "MallocExtension_ReleaseFreeMemory", None)
    if release is not None:
        release()
    trim = getattr(proc, "malloc_trim", None)
    if trim is not None:
        trim(ctypes.c_size_t(0))
    return max(0, before - status_bytes("RssAnon"))


def _wrap(original, stage: str):
    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        freed = release_free_memory()
        logger.info("omni-patches: returned %.1f MiB to the OS after %s", freed / 2**20, stage)
        return result

    setattr(wrapper, MARKER, NAME)
    return wrapper


def _make(load_model, determine_available_memory):
    return [_wrap(load_model, "weight loading"), _wrap(determine_available_memory, "warm-up")]


PATCH = Patch(
    name=NAME,
    targets={
        "vllm.v1.worker.cpu_worker:CPUWorker.load_model":  # inherited from Worker (gpu_worker.py)
            "953bf38a10da55f7e79d94d59436294d700a9a9cc0d49fd36de5736348710635",
        "vllm.v1.worker.cpu_worker:CPUWorker.determine_available_memory":
            "95c2fa7a439d74ae0251d24c5373f51f5231f19c09e4ac144c94883ee3bb9ae5",
    },
    make=_make,
    disable_env="OMNI_PATCH_RELEASE_MEMORY_OFF",
    doc=__doc__.split("\n")[0],
    where=('`vllm/v1/worker/cpu_worker.py:CPUWorker.load_model` (inherited `Worker.load_model`), '
           '`CPUWorker.determine_available_memory`'),
    bug='memory freed after weight loading and warm-up stays with the allocator',
    switch_doc='`OMNI_PATCH_RELEASE_MEMORY_OFF=1`',
    bug_test=('`tests/test_patches_engine.py::test_release_memory_after_load_lowers_worker_rss_anon` '
              '(engine: the worker keeps more RssAnon). Engine only: the memory is what weight loading'
              ' and warm-up leave with the allocator of a real worker'),
    fix_test='the same test',
)
