"""``_patch_modelinfo_cache_for_packages``: vLLM's model-info cache also for package modules.

Upstream behaviour (vLLM 0.28.0, ``vllm/model_executor/models/registry.py``
``_LazyRegisteredModel.inspect_model_cls``): before an engine starts, vLLM inspects the model
class in a fresh Python process (``_run_in_subprocess``) unless a cache file under
``$VLLM_CACHE_ROOT/modelinfos`` matches the hash of the module's source. It looks for the source
at ``vllm/model_executor/models/<name>.py``; the Transformers modeling backend is a package
(``models/transformers/__init__.py``), so the file never exists, nothing is cached, and every
start of an architecture served through that backend (Olmo2, Starcoder2 and the other
``("transformers", "TransformersForCausalLM")`` entries) pays a subprocess that imports vLLM
again (vLLM's own "Registry inspect model class" log line gives the duration).
``_get_modelinfo_module_hash`` already hashes every file of a package given its
``__init__.py``; the replacement hands it that path for package modules and keeps vLLM's
cache format, so the second start reads the cache. Single-file modules go to vLLM unchanged.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH", "package_init"]

NAME = "_patch_modelinfo_cache_for_packages"


def package_init(module_name: str) -> Path | None:
    """The ``__init__.py`` of ``module_name`` if it is a package on disk, else None (no import of it)."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations or not spec.origin:
        return None
    path = Path(spec.origin)
    return path if path.name == "__init__.py" and path.exists() else None


def _make(original):
    def inspect_model_cls(self):
        init = package_init(self.module_name)
        if init is None:
            return original(self)
        module_hash = self._get_modelinfo_module_hash(init)
        info = self._load_modelinfo_from_cache(module_hash)
        if info is None:
            info = original(self)  # vLLM's own subprocess inspection
            self._save_modelinfo_to_cache(info, module_hash)
        return info

    setattr(inspect_model_cls, MARKER, NAME)
    inspect_model_cls.__wrapped_original__ = original
    return [inspect_model_cls]


PATCH = Patch(
    name=NAME,
    targets={"vllm.model_executor.models.registry:_LazyRegisteredModel.inspect_model_cls":
             "ac920fc784b34486388ca5a5130161f6b96ef04685b0dc488115b29b1216032d"},
    make=_make,
    disable_env="OMNI_PATCH_MODELINFO_CACHE_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/model_executor/models/registry.py:_LazyRegisteredModel.inspect_model_cls`',
    bug=('the model-info cache looks for `models/<name>.py`; the Transformers backend is a package, so'
         ' every start of an architecture it serves (Olmo2, Starcoder2, ...) inspects the class in a '
         'new Python process (vLLM\'s "Registry inspect model class" log line gives its duration)'),
    switch_doc='`OMNI_PATCH_MODELINFO_CACHE_OFF=1`',
    bug_test='`tests/test_patch_modelinfo_cache.py::test_without_the_patch_every_inspection_is_a_new_process`',
    fix_test='`tests/test_patch_modelinfo_cache.py::test_second_inspection_reads_vllms_cache_file`',
)
