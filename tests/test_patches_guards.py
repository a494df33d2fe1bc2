"""omni-patches guards (C06): version range, fingerprints, all-or-nothing, idempotence, switches.

Each case runs in a fresh interpreter so that patching never leaks into other tests. The
snapshot records, for every target of every patch, the object its owner resolves it to (and
whether the owner holds it itself rather than by inheritance): "nothing patched" means every
one is still the very same object.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import clean_env
from omni_patches.patches import all_patches

TARGETS = [(p.name, t) for p in all_patches() for t in p.targets]

PRELUDE = textwrap.dedent("""
    import dataclasses, inspect, json, sys
    from omni_patches import PatchRefused, applied_patches, apply_all
    from omni_patches.guards import fingerprint, resolve
    from omni_patches.patches import MARKER, Patch, all_patches
    TARGETS = [t for p in all_patches() for t in p.targets]
    def snapshot(targets=TARGETS):
        out = {}
        for t in targets:
            owner, attr, _ = resolve(t)
            out[t] = (inspect.getattr_static(owner, attr), attr in vars(owner))
        return out
    def changed(before):
        now = snapshot(list(before))
        return sorted(t for t in before if now[t][0] is not before[t][0] or now[t][1] != before[t][1])
    def attempt(patches, **kw):
        try:
            apply_all(patches, **kw)
            return None, None
        except PatchRefused as e:
            return str(e), type(e.__cause__).__name__ if e.__cause__ else None
""")


def _run(code: str, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=clean_env(**env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_apply_twice_changes_nothing_the_second_time():
    out = _run("""
        import vllm.platforms.cpu as cpu
        first = apply_all()
        fn = cpu.CpuPlatform.check_and_update_config.__func__
        after_first = snapshot()
        second = apply_all()
        print(json.dumps({"first": first, "second": second, "changed": changed(after_first),
                          "same": cpu.CpuPlatform.check_and_update_config.__func__ is fn}))
    """)
    assert out["first"] == out["second"] == sorted([
        "_patch_cpu_aot_compile_cache_load", "_patch_cpu_explicit_kv_cache_memory",
        "_patch_cpu_release_memory_after_load", "_patch_cpu_small_machine_batch_defaults",
        "_patch_cpu_sampler_seeds", "_patch_cpu_pipeline_parallel_eager",
        "_patch_modelinfo_cache_for_packages", "_patch_token_ids_before_verify",
        "_patch_cpu_embedding_gemm_copy", "_patch_cpu_small_warmup", "_patch_tokenizer_pool_in_background",
        "_patch_text_model_processor_probe", "_patch_cpu_modelinfo_in_process",
        "_patch_cpu_speculation_default", "_patch_cpu_seeded_chunked_prefill",
        "_patch_lora_on_quantized_embeddings", "_patch_cpu_spec_expand_kernel",
        "_patch_detokenizer_prompt_mid_character", "_patch_cpu_kv_cache_lazy_pages",
        "_patch_inductor_isa_probe_cache", "_patch_inductor_triton_key_cache"])
    assert out["same"] and out["changed"] == []


def test_two_patches_of_one_target_compose_and_a_second_apply_adds_no_layer():
    """CPUModelRunner.warming_up_model has two patches (pipeline stages, the small warm-up): the later wraps
    the earlier instead of dropping it, and applying again wraps neither a second time."""
    out = _run("""
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        apply_all()
        def chain():
            names, fn = [], CPUModelRunner.warming_up_model
            while fn is not None:
                names.append(getattr(fn, MARKER, None))
                fn = getattr(fn, "__wrapped__", None)
            return names
        first = chain()
        apply_all()
        print(json.dumps({"first": first, "second": chain()}))
    """)
    markers = [m for m in out["first"] if m is not None]  # vLLM's own decorator adds an unmarked layer
    assert markers == ["_patch_cpu_pipeline_parallel_eager", "_patch_cpu_small_warmup"], out
    assert out["second"] == out["first"]


def test_c06_unsupported_version_patches_nothing():
    out = _run("""
        before = snapshot()
        msg, _ = attempt(None, vllm_version="0.29.1")
        print(json.dumps({"msg": msg, "changed": changed(before), "applied": sorted(applied_patches())}))
    """)
    assert out["msg"] and "0.28.0" in out["msg"] and "0.29.1" in out["msg"]
    assert out["changed"] == [] and out["applied"] == []


CHANGED_UPSTREAM = '''"""A target's new source, as a vLLM release that changed it would ship."""


def changed_upstream(*args, **kwargs):
    return "upstream changed"
'''

HOW = ["fingerprint", "source", "no_source", "missing"]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict:
    """Every target of every patch made wrong in each way of ``HOW``, one at a time, in one
    interpreter: the recorded fingerprint changed; the target's source changed (the target
    replaced by a function of another source, from a file, as an upstream change would); the
    target replaced by a function whose source cannot be read (made at run time); the target's
    name unresolvable. The broken patch goes last, after the seven sound ones: the refusal must
    come before any of them is applied."""
    folder = tmp_path_factory.mktemp("changed-upstream")
    (folder / "changed_upstream.py").write_text(CHANGED_UPSTREAM)
    return _run("""
        sys.path.insert(0, FOLDER)
        from changed_upstream import changed_upstream
        exec("def no_source(*args, **kwargs):\\n    return 'made at run time'")
        pristine = snapshot()
        results = {}
        for p in all_patches():
            others = [q for q in all_patches() if q.name != p.name]
            for t in p.targets:
                for how in HOW:
                    owner, attr, _ = resolve(t)
                    raw, own = inspect.getattr_static(owner, attr), attr in vars(owner)
                    bad = p
                    if how == "fingerprint":
                        bad = dataclasses.replace(p, targets={**p.targets, t: "0" * 64})
                    elif how == "missing":
                        bad = dataclasses.replace(p, targets={(k + "_gone" if k == t else k): v
                                                              for k, v in p.targets.items()})
                    else:
                        new = changed_upstream if how == "source" else no_source
                        setattr(owner, attr, classmethod(new) if isinstance(raw, classmethod) else new)
                    before = snapshot()
                    msg, _ = attempt([*others, bad])
                    results[f"{p.name} {t} {how}"] = {"msg": msg, "changed": changed(before),
                                                      "applied": sorted(applied_patches())}
                    if how in ("source", "no_source"):  # upstream back as it was, for the next case
                        if own:
                            setattr(owner, attr, raw)
                        else:
                            delattr(owner, attr)
        print(json.dumps({"results": results, "changed": changed(pristine)}))
    """.replace("FOLDER", repr(str(folder))).replace("HOW", repr(HOW)))


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(("patch", "target"), TARGETS, ids=[t for _, t in TARGETS])
def test_c06_each_target_wrong_refuses_its_patch_and_patches_nothing(refusals, patch, target, how):
    out = refusals["results"][f"{patch} {target} {how}"]
    assert out["msg"], f"{patch} applied although {target} was wrong ({how})"
    # A target changed upstream refuses every patch of it; the first checked is named.
    named = [patch] if how in ("fingerprint", "missing") else [p for p, t in TARGETS if t == target]
    assert any(f"refusing {p}, nothing patched" in out["msg"] for p in named) and target in out["msg"], out["msg"]
    says = {"missing": "not found", "no_source": "source fingerprint unavailable"}.get(how, "source fingerprint ")
    assert says in out["msg"], out["msg"]
    assert out["changed"] == [], f"patched before the refusal: {out['changed']}"
    assert out["applied"] == []


def test_refusal_cases_cover_every_target_and_leave_vllm_as_it_was(refusals):
    assert len(refusals["results"]) == len(HOW) * len(TARGETS) and len(TARGETS) > len(all_patches())  # two-target patch
    assert refusals["changed"] == []


def test_missing_module_or_method_is_refused():
    out = _run("""
        msgs = []
        for target in ("vllm.platforms.cpu:CpuPlatform.no_such_method", "vllm.no_such_module:f"):
            p = Patch("x", {target: "0" * 64}, lambda f: [f], "OMNI_PATCH_KV_CACHE_OFF", "")
            before = snapshot()
            msgs.append([attempt([*all_patches(), p])[0], changed(before)])
        print(json.dumps({"msgs": msgs, "applied": sorted(applied_patches())}))
    """)
    (method, changed_method), (module, changed_module) = out["msgs"]
    assert "refusing x, nothing patched" in method and "no_such_method not found" in method
    assert "refusing x, nothing patched" in module and "vllm.no_such_module cannot be imported" in module
    assert changed_method == changed_module == [] and out["applied"] == []


FAKE_UPSTREAM = '''"""Stand-ins for upstream code: a class that takes a replacement, one that refuses any."""


class ReadOnly(type):
    def __setattr__(cls, name, value):
        raise AttributeError(f"{cls.__name__}.{name} is read-only")


class Open:
    def method(self):
        return "original"

    def other(self):
        return "original"


class Locked(metaclass=ReadOnly):
    def method(self):
        return "original"
'''


@pytest.fixture(scope="module")
def rollbacks(tmp_path_factory) -> dict:
    """The eight real patches, then a fake one that fails while it is applied: its make raises,
    returns too few or too many replacements, or its second setattr fails after the first
    succeeded. Each time every target (the real ones and the fake ones) must be the original
    object again and no patch recorded as applied; at the end a plain apply_all() applies all eight."""
    folder = tmp_path_factory.mktemp("fake-upstream")
    (folder / "fake_upstream.py").write_text(FAKE_UPSTREAM)
    return _run("""
        sys.path.insert(0, FOLDER)
        FAKE = ["fake_upstream:Open.method", "fake_upstream:Open.other", "fake_upstream:Locked.method"]
        pristine = snapshot(TARGETS + FAKE)
        def replacement(original):
            def method(self):
                return "replaced"
            setattr(method, MARKER, "fake")
            return method
        def boom(*originals):
            raise RuntimeError("boom in make")
        def fake(name, targets, make):
            return Patch(name, {t: fingerprint(resolve(t)[2]) for t in targets}, make, "OMNI_PATCH_KV_CACHE_OFF", "")
        cases = {
            "make_raises": fake("fake_raises", FAKE[:1], boom),
            "too_few": fake("fake_too_few", FAKE[:2], lambda a, b: [replacement(a)]),
            "too_many": fake("fake_too_many", FAKE[:1], lambda a: [replacement(a), replacement(a)]),
            "setattr_fails": fake("fake_locked", [FAKE[0], FAKE[2]], lambda a, b: [replacement(a), replacement(b)]),
        }
        results = {}
        for case, bad in cases.items():
            msg, cause = attempt([*all_patches(), bad])
            results[case] = {"msg": msg, "cause": cause, "changed": changed(pristine),
                             "applied": sorted(applied_patches())}
        results["then"] = {"applied": apply_all(), "changed": changed(pristine)}
        print(json.dumps(results))
    """.replace("FOLDER", repr(str(folder))))


@pytest.mark.parametrize(("case", "patch", "says", "cause"), [
    ("make_raises", "fake_raises", "RuntimeError('boom in make')", "RuntimeError"),
    ("too_few", "fake_too_few", "make() returned 1 replacement(s) for 2 target(s)", "PatchRefused"),
    ("too_many", "fake_too_many", "make() returned 2 replacement(s) for 1 target(s)", "PatchRefused"),
    ("setattr_fails", "fake_locked", "Locked.method is read-only", "AttributeError"),
])
def test_a_patch_failing_halfway_restores_every_target_of_the_call(rollbacks, case, patch, says, cause):
    out = rollbacks[case]
    assert out["msg"] and f"refusing {patch}" in out["msg"] and says in out["msg"], out["msg"]
    assert "every target this call had set is restored, nothing patched" in out["msg"], out["msg"]
    assert out["cause"] == cause
    assert out["changed"] == [], f"left patched: {out['changed']}"
    assert out["applied"] == []


def test_after_a_rolled_back_call_apply_all_applies_every_patch(rollbacks):
    then = rollbacks["then"]
    assert then["applied"] == sorted(p.name for p in all_patches())
    assert then["changed"] == sorted({t for _, t in TARGETS}), "every real target replaced, no fake one"


def test_switch_off_one_patch():
    out = _run("""
        print(json.dumps({"applied": apply_all()}))
    """, OMNI_PATCH_KV_CACHE_OFF="1")
    assert "_patch_cpu_explicit_kv_cache_memory" not in out["applied"]
    assert len(out["applied"]) == len(all_patches()) - 1


def test_switch_accepts_the_registry_spellings_and_rejects_others():
    out = _run("""
        print(json.dumps({"applied": apply_all()}))
    """, OMNI_PATCH_KV_CACHE_OFF="true")
    assert "_patch_cpu_explicit_kv_cache_memory" not in out["applied"]
    proc = subprocess.run([sys.executable, "-c", "from omni_patches import apply_all; apply_all()"],
                          env=clean_env(OMNI_PATCH_KV_CACHE_OFF="maybe"), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "OMNI_PATCH_KV_CACHE_OFF='maybe' is invalid" in proc.stderr
