"""``_patch_cpu_modelinfo_in_process``: on CPU a model class is inspected in this process, not a new one.

Upstream behaviour (vLLM 0.28.0, ``vllm/model_executor/models/registry.py``): when the model-info
cache under ``$VLLM_CACHE_ROOT/modelinfos`` has no entry for an architecture (the first start with a
new cache root, a new vLLM, a new architecture), ``_LazyRegisteredModel.inspect_model_cls`` runs
``_run_in_subprocess``: a new Python interpreter that imports vLLM and its plugins again, imports
the model's module and pickles back the class's ``_ModelInfo``, "to avoid initializing CUDA" in
the caller. On CPU there is no CUDA to initialise, and the interpreter's imports are 7 to 11 s of
the "model config" phase of a cold start on two cores (``python -m harness startup --cold``;
docs/startup.md gives the artifacts).

The replacement calls the function in this process (importing the model's module, which the
engine imports anyway; in the OpenAI server's front end the forked engine core inherits it) and
returns its result; an exception propagates to vLLM's caller (``_try_inspect_model_cls`` logs it
and returns ``None``, as for the subprocess's ``RuntimeError``). The cache file is written as before.
"""

from __future__ import annotations

import functools

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

NAME = "_patch_cpu_modelinfo_in_process"


def _make(original):
    @functools.wraps(original)
    def _run_in_subprocess(fn):
        return fn()

    setattr(_run_in_subprocess, MARKER, NAME)
    return [_run_in_subprocess]


PATCH = Patch(
    name=NAME,
    targets={"vllm.model_executor.models.registry:_run_in_subprocess":
             "9aeff7e83e939d8dde3f731f34d79bf5e89c5c61b614e60dbb1ba1c7c5ebabc7"},
    make=_make,
    disable_env="OMNI_PATCH_MODELINFO_IN_PROCESS_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/model_executor/models/registry.py:_run_in_subprocess`',
    bug=('not a bug: an architecture missing from the model-info cache (any start with a new '
         '`VLLM_CACHE_ROOT`, a new vLLM or a new architecture) is inspected in a new interpreter that '
         'imports vLLM again "to avoid initializing CUDA"; on CPU there is none. The replacement runs '
         'the inspection in this process; vLLM writes its cache file as before'),
    switch_doc='`OMNI_PATCH_MODELINFO_IN_PROCESS_OFF=1`',
    bug_test=('`tests/test_patch_modelinfo_in_process.py::test_an_uncached_model_class_is_inspected_in_this_process_with_vllms_answer`'
              ' (switched off: one child interpreter)'),
    fix_test='the same test (no child, the same `_ModelInfo`, the cache file written)',
)
