"""``_patch_text_model_processor_probe``: a text-only checkpoint is not loaded a second time to look for a processor.

Upstream behaviour (vLLM 0.28.0, ``vllm/renderers/hf.py``, ``_try_get_processor_chat_template``): to
resolve the chat template, the renderer first asks ``AutoProcessor.from_pretrained`` for the model's
processor and uses its template if the answer is a ``ProcessorMixin``. For a text-only checkpoint
transformers finds no processor and falls back to ``AutoTokenizer.from_pretrained``: a second full
load of the tokenizer, only to be thrown away. The chat template warm-up of every start does this
(``BaseRenderer.warmup``); on Qwen2.5-Coder-1.5B it is most of the server's "engine ready to first
token" phase (a py-spy profile of a warm start; docs/startup.md).

The replacement answers ``None`` (no processor template, cached as upstream caches it) without the
load when the checkpoint is a local directory from which ``AutoProcessor`` cannot build a processor,
by the same files transformers' ``AutoProcessor.from_pretrained`` (``processing_auto.py``) reads:
no ``processor_config.json``, ``preprocessor_config.json`` or ``video_preprocessor_config.json``; no
``processor_class`` and no ``auto_map.AutoProcessor`` in ``tokenizer_config.json`` or ``config.json``;
and a ``model_type`` that ``PROCESSOR_MAPPING_NAMES`` does not list. Anything else (a hub name, a
multimodal checkpoint, an unreadable file) goes to the original.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH", "cannot_have_a_processor"]

NAME = "_patch_text_model_processor_probe"
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")


def _json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def cannot_have_a_processor(name_or_path: str) -> bool:
    """Whether ``AutoProcessor.from_pretrained(name_or_path)`` can only fall back to a tokenizer (see above).

    False whenever it cannot tell: not a local directory, a file it cannot read or parse.
    """
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    folder = Path(name_or_path)
    if not folder.is_dir() or any((folder / f).exists() for f in PROCESSOR_FILES):
        return False
    tokenizer_config, config = _json(folder / "tokenizer_config.json"), _json(folder / "config.json")
    if tokenizer_config is None or config is None or not config:
        return False
    for d in (tokenizer_config, config):
        auto_map = d.get("auto_map")
        if "processor_class" in d or (isinstance(auto_map, dict) and "AutoProcessor" in auto_map):
            return False
    return config.get("model_type") not in PROCESSOR_MAPPING_NAMES


def _make(original):
    @functools.wraps(original)
    def _try_get_processor_chat_template(tokenizer, *, revision, code_revision, trust_remote_code):
        from vllm.renderers import hf

        if cannot_have_a_processor(tokenizer.name_or_path):
            hf._PROCESSOR_CHAT_TEMPLATES[(tokenizer.name_or_path, revision, code_revision, trust_remote_code)] = None
            return None
        return original(tokenizer, revision=revision, code_revision=code_revision, trust_remote_code=trust_remote_code)

    setattr(_try_get_processor_chat_template, MARKER, NAME)
    return [_try_get_processor_chat_template]


PATCH = Patch(
    name=NAME,
    targets={"vllm.renderers.hf:_try_get_processor_chat_template":
             "8be3770fc85dc8852637409805ae12858544db4a1466ae33f2856ae3f00aaa31"},
    make=_make,
    disable_env="OMNI_PATCH_PROCESSOR_PROBE_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/renderers/hf.py:_try_get_processor_chat_template`',
    bug=("not a bug: to find a processor's chat template the renderer calls "
         '`AutoProcessor.from_pretrained`, which for a text-only checkpoint loads the whole tokenizer '
         'a second time and is thrown away (the chat template warm-up of every start). The replacement'
         ' answers "no processor template" without the load for a local directory from which '
         '`AutoProcessor` cannot build a processor (no processor or preprocessor config, no '
         '`processor_class` or `auto_map.AutoProcessor`, a `model_type` outside '
         '`PROCESSOR_MAPPING_NAMES`); anything else goes to the original'),
    switch_doc='`OMNI_PATCH_PROCESSOR_PROBE_OFF=1`',
    bug_test=('not a bug: '
              '`tests/test_patch_switches.py::test_processor_probe_off_loads_a_processor_for_a_text_only_model`'
              ' (switched off: the renderer loads a processor once for SmolLM2 and answers None)'),
    fix_test=('the same test (None, and no load); '
              '`tests/test_processor_probe.py::test_only_a_checkpoint_autoprocessor_cannot_make_a_processor_of_skips_the_probe`'
              ' (each file or key that makes a processor sends the call to the original)'),
)
