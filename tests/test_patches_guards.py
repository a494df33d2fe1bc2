"""omni-patches guards (C06): version range, fingerprints, all-or-nothing, idempotence, switches.

Each case runs in a fresh interpreter so that patching never leaks into other tests.
"""

import json
import subprocess
import sys
import textwrap

from conftest import clean_env

TARGETS = {
    "kv": ("vllm.platforms.cpu", "CpuPlatform", "check_and_update_config"),
    "aot": ("vllm.compilation.decorators", None, "_try_load_aot_compiled_fn"),
    "load": ("vllm.v1.worker.cpu_worker", "CPUWorker", "load_model"),
}

PRELUDE = textwrap.dedent("""
    import json, importlib
    from omni_patches.guards import fingerprint
    TARGETS = %r
    def snapshot():
        out = {}
        for k, (mod, cls, attr) in TARGETS.items():
            owner = importlib.import_module(mod)
            owner = getattr(owner, cls) if cls else owner
            out[k] = fingerprint(getattr(owner, attr))
        return out
""") % (TARGETS,)


def _run(code: str, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=clean_env(**env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_apply_twice_changes_nothing_the_second_time():
    out = _run("""
        from omni_patches import apply_all
        import vllm.platforms.cpu as cpu
        first = apply_all()
        fn = cpu.CpuPlatform.check_and_update_config.__func__
        second = apply_all()
        print(json.dumps({"first": first, "second": second,
                          "same": cpu.CpuPlatform.check_and_update_config.__func__ is fn}))
    """)
    assert out["first"] == out["second"] == sorted([
        "_patch_cpu_aot_compile_cache_load", "_patch_cpu_explicit_kv_cache_memory",
        "_patch_cpu_release_memory_after_load", "_patch_cpu_small_machine_batch_defaults",
        "_patch_cpu_sampler_seeds", "_patch_cpu_pipeline_parallel_eager",
        "_patch_modelinfo_cache_for_packages", "_patch_token_ids_before_verify"])
    assert out["same"]


def test_c06_unsupported_version_patches_nothing():
    out = _run("""
        from omni_patches import apply_all, applied_patches, PatchRefused
        before = snapshot()
        try:
            apply_all(vllm_version="0.29.1")
            msg = None
        except PatchRefused as e:
            msg = str(e)
        print(json.dumps({"msg": msg, "unchanged": snapshot() == before, "applied": sorted(applied_patches())}))
    """)
    assert out["msg"] and "0.28.0" in out["msg"] and "0.29.1" in out["msg"]
    assert out["unchanged"] and out["applied"] == []


def test_c06_fingerprint_mismatch_names_the_method_and_patches_nothing():
    out = _run("""
        import dataclasses
        from omni_patches import apply_all, applied_patches, PatchRefused
        from omni_patches.patches import all_patches
        patches = all_patches()
        # the last patch now claims a different upstream source for its first target
        bad = patches[-1]
        target = next(iter(bad.targets))
        patches[-1] = dataclasses.replace(bad, targets={**bad.targets, target: "0" * 64})
        before = snapshot()
        try:
            apply_all(patches)
            msg = None
        except PatchRefused as e:
            msg = str(e)
        print(json.dumps({"msg": msg, "target": target, "unchanged": snapshot() == before,
                          "applied": sorted(applied_patches())}))
    """)
    assert out["msg"] and out["target"] in out["msg"] and "fingerprint" in out["msg"]
    assert out["unchanged"], "an earlier patch in the list was applied before the refusal"
    assert out["applied"] == []


def test_missing_target_is_refused():
    out = _run("""
        from omni_patches import apply_all, PatchRefused
        from omni_patches.patches import Patch
        p = Patch("x", {"vllm.platforms.cpu:CpuPlatform.no_such_method": "0" * 64}, lambda f: [f],
                  "OMNI_PATCH_KV_CACHE_OFF", "")
        try:
            apply_all([p]); msg = None
        except PatchRefused as e:
            msg = str(e)
        print(json.dumps({"msg": msg}))
    """)
    assert "no_such_method not found" in out["msg"]


def test_switch_off_one_patch():
    out = _run("""
        from omni_patches import apply_all
        print(json.dumps({"applied": apply_all()}))
    """, OMNI_PATCH_KV_CACHE_OFF="1")
    assert "_patch_cpu_explicit_kv_cache_memory" not in out["applied"]
    from omni_patches.patches import all_patches

    assert len(out["applied"]) == len(all_patches()) - 1


def test_switch_accepts_the_registry_spellings_and_rejects_others():
    out = _run("""
        from omni_patches import apply_all
        print(json.dumps({"applied": apply_all()}))
    """, OMNI_PATCH_KV_CACHE_OFF="true")
    assert "_patch_cpu_explicit_kv_cache_memory" not in out["applied"]
    proc = subprocess.run([sys.executable, "-c", "from omni_patches import apply_all; apply_all()"],
                          env=clean_env(OMNI_PATCH_KV_CACHE_OFF="maybe"), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "OMNI_PATCH_KV_CACHE_OFF='maybe' is invalid" in proc.stderr
