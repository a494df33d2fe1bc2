"""_patch_modelinfo_cache_for_packages: the Transformers backend's model info is inspected in a
subprocess once, then read from vLLM's own cache file (vLLM 0.28 misses it for package modules)."""

import json
import subprocess
import sys
import textwrap

from conftest import clean_env

CODE = textwrap.dedent("""
    import dataclasses, json, sys
    import vllm.model_executor.models.registry as registry
    from omni_patches import apply_all
    applied = "_patch_modelinfo_cache_for_packages" in apply_all()
    plain = lambda info: json.loads(json.dumps(dataclasses.asdict(info)))  # the cache stores JSON
    calls = []
    original = registry._run_in_subprocess
    def counting(fn):
        calls.append(1)
        return original(fn)
    registry._run_in_subprocess = counting
    model = registry._LazyRegisteredModel("vllm.model_executor.models.transformers", "TransformersForCausalLM")
    first = model.inspect_model_cls()
    second = model.inspect_model_cls()
    print(json.dumps({"applied": applied, "subprocesses": len(calls), "same": plain(first) == plain(second)}))
""")


def _inspect_twice(cache_root, **env):
    proc = subprocess.run([sys.executable, "-c", CODE], env=clean_env(VLLM_CACHE_ROOT=str(cache_root), **env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_inspection_reads_vllms_cache_file(tmp_path):
    patched = _inspect_twice(tmp_path)
    assert patched == {"applied": True, "subprocesses": 1, "same": True}
    cached = json.loads((tmp_path / "modelinfos" /
                         "vllm-model_executor-models-transformers-TransformersForCausalLM.json").read_text())
    assert cached["modelinfo"]["is_text_generation_model"] is True


def test_without_the_patch_every_inspection_is_a_new_process(tmp_path):
    """The upstream behaviour, switched off: vLLM looks for models/transformers.py, which does not
    exist (a package), so it neither reads nor writes the cache and inspects in a subprocess each time."""
    off = _inspect_twice(tmp_path, OMNI_PATCH_MODELINFO_CACHE_OFF="1")
    assert off == {"applied": False, "subprocesses": 2, "same": True}
    assert not list((tmp_path / "modelinfos").glob("*TransformersForCausalLM*"))


def test_single_file_modules_are_left_to_vllm():
    from omni_patches.patches.modelinfo_cache import package_init

    assert package_init("vllm.model_executor.models.llama") is None
    assert package_init("vllm.model_executor.models.transformers").name == "__init__.py"
    assert package_init("no.such.module") is None
