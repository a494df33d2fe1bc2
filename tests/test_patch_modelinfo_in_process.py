"""_patch_cpu_modelinfo_in_process: a model class is inspected without a new interpreter, with vLLM's result."""

import json
import subprocess
import sys
import textwrap

from conftest import clean_env

CODE = textwrap.dedent("""
    import dataclasses, json, subprocess
    import vllm.model_executor.models.registry as registry
    from omni_patches import apply_all
    applied = "_patch_cpu_modelinfo_in_process" in apply_all()
    children = []
    real_run = subprocess.run
    def counting(cmd, *a, **kw):
        children.append(cmd)
        return real_run(cmd, *a, **kw)
    subprocess.run = counting
    model = registry._LazyRegisteredModel("vllm.model_executor.models.qwen2", "Qwen2ForCausalLM")
    info = json.loads(json.dumps(dataclasses.asdict(model.inspect_model_cls())))
    print(json.dumps({"applied": applied, "children": len(children), "info": info}))
""")


def _inspect(cache_root, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", CODE], env=clean_env(VLLM_CACHE_ROOT=str(cache_root), **env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_uncached_model_class_is_inspected_in_this_process_with_vllms_answer(tmp_path):
    on = _inspect(tmp_path / "on")
    off = _inspect(tmp_path / "off", OMNI_PATCH_MODELINFO_IN_PROCESS_OFF="1")  # the upstream subprocess
    assert on["applied"] and on["children"] == 0
    assert not off["applied"] and off["children"] == 1
    assert on["info"] == off["info"] and on["info"]["is_text_generation_model"] is True
    assert list((tmp_path / "on" / "modelinfos").glob("*Qwen2ForCausalLM*")), "the cache file is written as before"
