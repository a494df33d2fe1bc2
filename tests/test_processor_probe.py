"""omni-patches' _patch_text_model_processor_probe: which checkpoints skip AutoProcessor, and the same template."""

import json

import pytest


def _checkpoint(folder, config=None, tokenizer_config=None, files=()):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "qwen2"}))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config or {}))
    for f in files:
        (folder / f).write_text("{}")
    return folder


@pytest.mark.parametrize(("case", "kwargs", "skip"), [
    ("text-only", {}, True),
    ("processor_config.json", {"files": ["processor_config.json"]}, False),
    ("preprocessor_config.json", {"files": ["preprocessor_config.json"]}, False),
    ("video_preprocessor_config.json", {"files": ["video_preprocessor_config.json"]}, False),
    ("processor_class in tokenizer_config", {"tokenizer_config": {"processor_class": "X"}}, False),
    ("processor_class in config", {"config": {"model_type": "qwen2", "processor_class": "X"}}, False),
    ("auto_map", {"config": {"model_type": "qwen2", "auto_map": {"AutoProcessor": "m.P"}}}, False),
    ("a multimodal model type", {"config": {"model_type": "qwen2_vl"}}, False),
])
def test_only_a_checkpoint_autoprocessor_cannot_make_a_processor_of_skips_the_probe(tmp_path, case, kwargs, skip):
    from omni_patches.patches.processor_probe import cannot_have_a_processor

    assert cannot_have_a_processor(str(_checkpoint(tmp_path / "m", **kwargs))) is skip, case


def test_a_hub_name_or_a_broken_file_goes_to_the_original(tmp_path):
    from omni_patches.patches.processor_probe import cannot_have_a_processor

    assert not cannot_have_a_processor("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    broken = _checkpoint(tmp_path / "m")
    (broken / "config.json").write_text("{not json")
    assert not cannot_have_a_processor(str(broken))


def test_the_real_models_template_is_what_upstream_resolves(real_model):
    """SmolLM2 (text-only): the replacement answers None without AutoProcessor, as the original does after it."""
    from transformers import AutoTokenizer
    from vllm.renderers import hf

    from omni_patches.patches.processor_probe import PATCH

    tok = AutoTokenizer.from_pretrained(real_model)
    original = hf._try_get_processor_chat_template
    (patched,) = PATCH.make(original)
    kw = {"revision": None, "code_revision": None, "trust_remote_code": False}
    hf._PROCESSOR_CHAT_TEMPLATES.clear()
    want = original(tok, **kw)
    hf._PROCESSOR_CHAT_TEMPLATES.clear()
    assert patched(tok, **kw) == want is None
    assert hf._PROCESSOR_CHAT_TEMPLATES[(tok.name_or_path, None, None, False)] is None
