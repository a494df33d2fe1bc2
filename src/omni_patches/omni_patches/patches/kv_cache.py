"""``_patch_cpu_explicit_kv_cache_memory``: an explicit ``kv_cache_memory_bytes`` wins (C01).

Upstream bug (vLLM 0.28.0, ``vllm/platforms/cpu.py``, ``CpuPlatform.check_and_update_config``):
whenever ``VLLM_CPU_KVCACHE_SPACE`` is set it overwrites
``cache_config.kv_cache_memory_bytes`` with that many GiB, even when the user passed
``kv_cache_memory_bytes`` to the engine. The replacement runs the original and, when
the user had set ``kv_cache_memory_bytes``, puts it back and logs which setting won.
"""

from __future__ import annotations

import logging
import os

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

logger = logging.getLogger("vllm.omni_patches.kv_cache")
NAME = "_patch_cpu_explicit_kv_cache_memory"


def _make(original):
    func = original.__func__  # a classmethod

    def check_and_update_config(cls, vllm_config) -> None:
        explicit = vllm_config.cache_config.kv_cache_memory_bytes
        func(cls, vllm_config)
        env = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
        if explicit is not None and env != "" and vllm_config.cache_config.kv_cache_memory_bytes != explicit:
            vllm_config.cache_config.kv_cache_memory_bytes = explicit
            logger.info(
                "omni-patches: kv_cache_memory_bytes=%d (explicit) wins over VLLM_CPU_KVCACHE_SPACE=%s GiB",
                explicit, env,
            )

    setattr(check_and_update_config, MARKER, NAME)
    check_and_update_config.__wrapped_original__ = func
    return [classmethod(check_and_update_config)]


PATCH = Patch(
    name=NAME,
    targets={"vllm.platforms.cpu:CpuPlatform.check_and_update_config":
             "97a099cf8ed6a5ea27030544d38319bf4ff5ad4726bfab63e8059b7c1ef8d4f6"},
    make=_make,
    disable_env="OMNI_PATCH_KV_CACHE_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/platforms/cpu.py:CpuPlatform.check_and_update_config`',
    bug='`VLLM_CPU_KVCACHE_SPACE` overwrites an explicit `kv_cache_memory_bytes` (C01)',
    switch_doc='`OMNI_PATCH_KV_CACHE_OFF=1`',
    bug_test=('`tests/test_patches_off.py::test_c01_kv_cache_off_lets_vllm_cpu_kvcache_space_overwrite_the_explicit_budget`;'
              ' in an engine `tests/test_patches_engine.py::test_c01_bug_without_the_patch`'),
    fix_test='the first test; `test_patches_engine.py::test_c01_explicit_kv_cache_memory_bytes_wins`',
)
