"""``_patch_cpu_aot_compile_cache_load``: a warm start loads the saved compiled model.

Upstream bug (vLLM 0.28.0, ``vllm/compilation/decorators.py``, ``_try_load_aot_compiled_fn``):
after ``torch.compiler.load_compiled_function`` it calls
``loaded_fn._artifacts.compiled_fn.finalize_loading(...)``, a method of vLLM's piecewise
``VllmSerializableFunction``. On CPU the model is compiled with
``CompilationMode.DYNAMO_TRACE_ONCE`` and inductor, so the saved ``compiled_fn`` is a plain
function: the call raises ``'function' object has no attribute 'finalize_loading'``, the
load is abandoned ("Compiling model again due to a load failure") and every start
recompiles. The replacement calls the original with ``torch.compiler.load_compiled_function``
wrapped, for the duration of that call only, so that a loaded plain function gains a
no-op ``finalize_loading`` (it has nothing left to finalize).
"""

from __future__ import annotations

import functools

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

NAME = "_patch_cpu_aot_compile_cache_load"


def _noop_finalize(vllm_config) -> None:
    """Nothing to finalize: an inductor-compiled plain function is complete once loaded."""


def _make(original):
    import torch

    @functools.wraps(original)
    def _try_load_aot_compiled_fn(model, aot_compilation_path):
        real_load = torch.compiler.load_compiled_function

        def load_compiled_function(*args, **kwargs):
            loaded = real_load(*args, **kwargs)
            compiled = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
            if compiled is not None and not hasattr(compiled, "finalize_loading"):
                compiled.finalize_loading = _noop_finalize
            return loaded

        torch.compiler.load_compiled_function = load_compiled_function
        try:
            return original(model, aot_compilation_path)
        finally:
            torch.compiler.load_compiled_function = real_load

    setattr(_try_load_aot_compiled_fn, MARKER, NAME)
    return [_try_load_aot_compiled_fn]


PATCH = Patch(
    name=NAME,
    targets={"vllm.compilation.decorators:_try_load_aot_compiled_fn":
             "b3f9cf5105da6eaa982c13407d28f4842f454e0f17818a84fc8db4556c31084f"},
    make=_make,
    disable_env="OMNI_PATCH_AOT_CACHE_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/compilation/decorators.py:_try_load_aot_compiled_fn`',
    bug=("on CPU the AOT artifact's compiled function has no `finalize_loading`; the load fails and "
         'every start recompiles'),
    switch_doc='`OMNI_PATCH_AOT_CACHE_OFF=1`',
    bug_test=('`tests/test_patches_engine.py::test_aot_compile_cache_second_start_loads_instead_of_recompiling`'
              ' (engine: the warm start logs the `finalize_loading` failure and recompiles). Engine '
              'only: the bug is in loading the artifact that an earlier compiled start saved'),
    fix_test="the same test's third start loads the artifact",
)
