"""``_patch_cpu_kv_cache_lazy_pages``: the KV cache becomes resident as tokens are written, not at start.

Upstream behaviour (vLLM 0.28.0, ``vllm/v1/worker/gpu_model_runner.py``,
``GPUModelRunner._allocate_kv_cache_tensors``, which the CPU runner inherits): every KV cache tensor is
``torch.zeros(size, dtype=int8)``; on CPU that memset writes every page, so the whole budget is resident
anonymous memory (RssAnon) from the first second, whatever the traffic: a server started on Qwen2.5-Coder-1.5B
without ``--max-model-len`` held about 9 GB before its first request (docs/memory.md).

The replacement allocates each tensor of a CPU runner from its own private anonymous mapping
(``mmap(MAP_PRIVATE | MAP_ANONYMOUS)``, man 2 mmap): the kernel hands out zero-filled pages on first
write, so the contents are the zeros vLLM asked for and a page becomes resident when the first token of
a block lands in it. The mapping lives as long as the tensor (``torch.frombuffer`` keeps the mmap
object). Other devices, and the packed layout (``block_stride > 0``), take vLLM's own path.

What it does not do: pages of blocks freed when a request ends stay resident (vLLM keeps their contents
for its prefix cache), so RssAnon follows the most tokens held at once, not the current ones.
"""

from __future__ import annotations

import functools
import logging
import mmap

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH", "lazy_zeros"]

logger = logging.getLogger("vllm.omni_patches.kv_lazy_pages")
NAME = "_patch_cpu_kv_cache_lazy_pages"


def lazy_zeros(nbytes: int):
    """An int8 CPU tensor of ``nbytes`` zeros backed by a private anonymous mapping: no page is resident
    until written.

    Raises:
        ValueError: ``nbytes`` is not positive.
        OSError: the kernel refused the mapping (address space or overcommit limits).
    """
    import torch

    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(buf, dtype=torch.int8)


def _make(original):
    @functools.wraps(original)
    def _allocate_kv_cache_tensors(self, kv_cache_config):
        if getattr(self.device, "type", None) != "cpu" or any(
                t.block_stride > 0 for t in kv_cache_config.kv_cache_tensors):
            return original(self, kv_cache_config)
        raw = {}
        total = 0
        for t in kv_cache_config.kv_cache_tensors:
            tensor = lazy_zeros(t.size)
            total += t.size
            for layer_name in t.shared_by:
                raw[layer_name] = tensor
        wanted = {n for g in kv_cache_config.kv_cache_groups for n in g.layer_names
                  if n not in self.runner_only_attn_layers}
        if wanted != set(raw):
            raise RuntimeError(f"omni-patches {NAME}: the KV tensors name layers {sorted(set(raw) ^ wanted)} "
                               "differently from the KV cache groups; set OMNI_PATCH_KV_LAZY_PAGES_OFF=1")
        logger.info("omni-patches: KV cache of %.1f MiB mapped lazily: pages become resident as tokens are "
                    "written (OMNI_PATCH_KV_LAZY_PAGES_OFF=1: vLLM's zero-filled allocation)", total / 2**20)
        return raw

    setattr(_allocate_kv_cache_tensors, MARKER, NAME)
    return [_allocate_kv_cache_tensors]


PATCH = Patch(
    name=NAME,
    targets={"vllm.v1.worker.gpu_model_runner:GPUModelRunner._allocate_kv_cache_tensors":
             "28950ef7b128de4c124596e4ca1012193a078d95c5417ac4c3ace262a57a69df"},
    make=_make,
    disable_env="OMNI_PATCH_KV_LAZY_PAGES_OFF",
    doc=__doc__.split("\n")[0],
    where=('`vllm/v1/worker/gpu_model_runner.py:GPUModelRunner._allocate_kv_cache_tensors` (inherited '
           'by the CPU runner)'),
    bug=('not a bug: every KV tensor is `torch.zeros`, whose memset makes the whole KV budget resident'
         ' anonymous memory at start, whatever the traffic. The replacement maps each CPU KV tensor '
         'from a private anonymous mapping, zero-filled by the kernel on first write, so a page '
         'becomes resident when a token lands in it; pages of freed blocks stay resident (the prefix '
         'cache keeps their contents)'),
    switch_doc='`OMNI_PATCH_KV_LAZY_PAGES_OFF=1`',
    bug_test=('not a bug: '
              '`tests/test_kv_lazy_pages.py::test_the_kv_cache_is_resident_only_as_tokens_are_written`'
              ' (switched off: the worker holds the whole KV budget as RssAnon before any request)'),
    fix_test='the same test (on: about what the written tokens need, and the same greedy tokens)',
)
