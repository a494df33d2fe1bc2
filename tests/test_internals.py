"""The stable packages' reliance on vLLM internals (omni_platform/internals.py): every fingerprint matches the
vLLM installed, and a changed one turns the feature off with vLLM's own path and a warning naming what changed,
in the platform's choice, in the fused layers' choice, in the speculation default, and in a real engine."""

import json
import logging
import os
import textwrap
from types import SimpleNamespace

import pytest

from conftest import clean_env, run_engine
from omni_platform import internals

FAKE = "0" * 64


@pytest.fixture
def fresh_verdicts(monkeypatch):
    """holds() decides once per process: forget earlier verdicts for this test."""
    monkeypatch.setattr(internals, "_VERDICTS", {})


def _tamper(monkeypatch, name: str) -> str:
    target = next(iter(internals.INTERNALS[name].targets))
    monkeypatch.setitem(internals.INTERNALS[name].targets, target, FAKE)
    return target


@pytest.mark.parametrize("name", sorted(internals.INTERNALS))
def test_every_fingerprint_matches_the_vllm_installed(name):
    assert internals.changed(name) == [], (
        f"vLLM code {name} relies on changed; review {internals.INTERNALS[name].user} against it, then record "
        "the new fingerprints: " + json.dumps({t: internals.target_fingerprint(t)
                                               for t in internals.INTERNALS[name].targets}, indent=1))


def test_a_missing_target_is_named_not_raised(monkeypatch):
    monkeypatch.setitem(internals.INTERNALS["attention_one_op"].targets, "vllm.forward_context:NoSuchThing", FAKE)
    monkeypatch.setitem(internals.INTERNALS["attention_one_op"].targets, "op:_C::no_such_op", FAKE)
    lines = internals.changed("attention_one_op")
    assert any("NoSuchThing not found" in ln for ln in lines)
    assert any(ln.startswith("op:_C::no_such_op: no such op") for ln in lines)


def test_a_changed_attention_fingerprint_gives_vllms_backend_and_says_why(monkeypatch, fresh_verdicts, caplog):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from omni_platform.platform import OmniPlatform

    selector = SimpleNamespace(use_sparse=False, use_mla=False)
    assert OmniPlatform.get_attn_backend_cls(None, selector) == "omni_platform.attention.OmniCpuAttentionBackend"
    internals._VERDICTS.clear()
    target = _tamper(monkeypatch, "attention_one_op")
    with caplog.at_level(logging.WARNING, logger="vllm.omni_platform"):
        assert OmniPlatform.get_attn_backend_cls(None, selector) == AttentionBackendEnum.CPU_ATTN.get_path()
    (warning,) = [r.getMessage() for r in caplog.records if "attention_one_op" in r.getMessage()]
    assert target in warning and "vLLM's CPUAttentionBackend" in warning


def test_a_changed_layer_fingerprint_keeps_vllms_decoder_layers(monkeypatch, fresh_verdicts, caplog):
    from omni_quant.runtime.fused_layers import wanted

    config = SimpleNamespace(quant_config=SimpleNamespace(get_name=lambda: "cpu_int4"), lora_config=None,
                             parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))
    monkeypatch.setenv("OMNI_FUSED_LAYERS", "1")
    assert wanted(config) is True
    internals._VERDICTS.clear()
    target = _tamper(monkeypatch, "fused_decoder_layers")
    with caplog.at_level(logging.WARNING, logger="vllm.omni_platform"):
        assert wanted(config) is False
    assert any(target in r.getMessage() and "vLLM's decoder layers" in r.getMessage() for r in caplog.records)


SITECUSTOMIZE = """
from omni_platform import internals
targets = internals.INTERNALS[{name!r}].targets
targets[next(iter(targets))] = {fake!r}
"""


@pytest.mark.engine
def test_an_engine_whose_attention_code_changed_runs_vllms_attention_with_the_same_tokens(tiny_llama, tmp_path):
    """The engine core and worker are separate processes: the changed fingerprint is put into every process by a
    sitecustomize module, as a changed vLLM would be seen by each."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE.format(name="attention_one_op", fake=FAKE)))
    config = {"llm": {"model": str(tiny_llama), "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 2,
                      "kv_cache_memory_bytes": 16 << 20, "skip_tokenizer_init": True},
              "prompts": [[1, 17, 42, 99, 7], [1, 250, 3, 8]], "max_tokens": 12}
    env = dict(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(tmp_path / "cache"))
    normal = run_engine(config, clean_env(**env))
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    changed = run_engine(config, clean_env(PYTHONPATH=path, **env))
    assert "OmniCpuAttentionBackend, one op per layer" in normal.log
    assert "OmniCpuAttentionBackend" not in changed.log
    assert "attention_one_op (omni_platform.attention) is off: the vLLM code it relies on changed" in changed.log
    assert "running vLLM's CPUAttentionBackend (two ops per layer) instead" in changed.log
    assert changed["token_ids"] == normal["token_ids"] and all(len(t) == 12 for t in normal["token_ids"])


def test_docs_stability_lists_every_internal_and_target():
    from harness import REPO

    text = (REPO / "docs" / "stability.md").read_text()
    for internal in internals.INTERNALS.values():
        for piece in (internal.name, internal.user, internal.fallback, internal.switch, *internal.targets):
            assert piece in text, f"docs/stability.md does not name {piece!r} of {internal.name}"
