"""The vLLM internals omni's stable packages read, each fingerprinted, with vLLM's own path as the fallback.

omni-platform and omni-quant promise to reach vLLM through what it publishes: the platform and general
plugin entry points, ``register_quantization_config``, ``ModelRegistry.register_model``, the platform's
classmethods, custom ops. Four features go further and depend on code vLLM does not publish as an interface:

- ``attention_one_op`` (:mod:`omni_platform.attention`): subclasses ``CPUAttentionBackendImpl``, mirrors its
  ``forward`` and ``do_kv_cache_update``, calls the ``_C`` kernels with their positional arguments and reads
  the layer's private ``_k_scale_float``/``_v_scale_float``;
- ``fused_decoder_layers`` (``omni_quant.runtime.fused_layers``): replaces the ``forward`` of vLLM's Qwen2 and Llama
  decoder layers with two ops that compute what the replaced code computes, reading the parts' attributes;
- ``gated_proposer`` (:mod:`omni_platform.spec_proposer`, the speculation default): vLLM's ``custom_class``
  proposer hook, which vLLM 0.28 marks experimental (its call signature lives in the model runner);
- ``api_key_on_every_route`` (:mod:`omni_platform.api_key`): reads the server's parsed arguments from
  ``app.state.args``, which vLLM's ``build_app`` sets, for the keys vLLM itself checks.

Each is declared here with the sha256 of every piece of vLLM it relies on, as installed when omni was
written and tested against vLLM 0.28.0 (:data:`INTERNALS`): a function's dedented source (the same
fingerprint omni-patches uses), or a ``_C`` op's schema. Before a feature is used, :func:`holds` compares
them with the vLLM installed; on any difference the feature is not used, vLLM's own path runs instead,
and one warning per process names each piece that changed and what runs instead. ``omni-info`` lists
them. The same idea as omni-patches' guards (``omni_patches/guards.py``), applied to the stable packages'
own code: a vLLM update costs speed, never a wrong token or a traceback.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import textwrap
from dataclasses import dataclass
from typing import Any

__all__ = ["INTERNALS", "Internal", "changed", "fingerprint", "holds", "target_fingerprint"]

logger = logging.getLogger("vllm.omni_platform")


def fingerprint(fn: Any) -> str:
    """sha256 (hex) of a function's dedented source (``inspect.unwrap`` first): the identity of vLLM code omni
    mirrors or replaces.

    Raises:
        OSError, TypeError: no source for ``fn`` (``inspect.getsource``).
    """
    src = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    return hashlib.sha256(src.encode()).hexdigest()


def target_fingerprint(target: str) -> str:
    """The fingerprint of ``target`` in the vLLM installed.

    ``target``: ``module:qualname`` (a function, method or class: :func:`fingerprint` of its source; an empty
    qualname: the whole module's source) or
    ``op:namespace::name`` (the sha256 of the op's schema string, after importing ``vllm._custom_ops``,
    which loads vLLM's ``_C`` library).

    Raises:
        LookupError: the module, attribute or op does not exist; OSError, TypeError: no source.
    """
    if target.startswith("op:"):
        import torch

        namespace, _, name = target[3:].partition("::")
        importlib.import_module("vllm._custom_ops")
        try:
            schema = str(getattr(getattr(torch.ops, namespace), name).default._schema)
        except (AttributeError, RuntimeError) as e:
            raise LookupError(f"no such op ({e})") from e
        return hashlib.sha256(schema.encode()).hexdigest()
    module_name, _, qualname = target.partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise LookupError(f"module {module_name} cannot be imported ({e})") from e
    for part in qualname.split(".") if qualname else ():
        if not hasattr(owner, part):
            raise LookupError(f"{part} not found")
        owner = getattr(owner, part)
    return fingerprint(owner)


@dataclass(frozen=True)
class Internal:
    """One feature of a stable package that relies on vLLM internals.

    ``name``: its key; ``user``: the omni module that relies on them; ``fallback``: what runs when they
    changed; ``switch``: the setting that turns the feature off by hand; ``targets``: each relied-on piece
    (``module:qualname`` or ``op:ns::name``, :func:`target_fingerprint`) -> its sha256 in vLLM 0.28.0,
    and ``why``: what the feature needs from it."""

    name: str
    user: str
    fallback: str
    switch: str
    targets: dict[str, str]
    why: str


INTERNALS: dict[str, Internal] = {i.name: i for i in (
    Internal(
        "attention_one_op", "omni_platform.attention", "vLLM's CPUAttentionBackend (two ops per layer)",
        "OMNI_CPU_ATTN_ONE_OP=0",
        {
            "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.__init__":
                "cc46ee4e67722415a09f431782fc2c822031ef6fbf9b12c791ab4e748994f79d",
            "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward":
                "245a502e5e6a5fac9d1641b43d44c3ae8965eb0d188892b6c2379ed4c948cb9d",
            "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.do_kv_cache_update":
                "dae832e1650ebc0ef22b15065fc1c0a2b2a02d4c611038197540b36f7862cc01",
            "vllm.model_executor.layers.attention.attention:Attention.forward":
                "a1bf0737afbbacfa9736b554c8830b174964f5e1286a338d9f8f470944b354a6",
            "vllm.model_executor.layers.attention.attention:unified_kv_cache_update":
                "b9f6bf5a0cc11eb727bf6ac2d5edace8bdbf4ed46239890ca4b8ef58b4aad10c",
            "vllm.model_executor.layers.attention.attention:set_default_quant_scales":
                "516dc55daacc7f3695e96ae4648b7833179412ce90ef30e430cdd13e1794a605",
            "vllm.forward_context:ForwardContext":
                "8fc28df97363cdcc80ade623998f33cfc6c85fa39c556ba3e2fb558c41a999c0",
            "op:_C::cpu_attn_reshape_and_cache":
                "ceca9d1d43d0456621e79750b2f57fe7b942adac083621334e5fa0bb9e22ad9a",
            "op:_C::cpu_attention_with_kv_cache":
                "b5861b7b720d65fc4de45e5bba7463da686ae0d609d81e10a30ee9d21d72cb62",
        },
        "the subclass mirrors the backend's forward and KV write, skips the write where Attention.forward "
        "would skip unified_kv_cache_update, reads the layer's _k_scale_float/_v_scale_float (set by "
        "set_default_quant_scales) and the forward context's slot_mapping, and calls both _C kernels with "
        "positional arguments"),
    Internal(
        "fused_decoder_layers", "omni_quant.runtime.fused_layers", "vLLM's decoder layers", "OMNI_FUSED_LAYERS=0",
        {
            "vllm.model_executor.models.qwen2:Qwen2DecoderLayer.forward":
                "ed1f90a51dab0fe341eb12d01a3c8658144d1f46423e0528682048829fd45f1e",
            "vllm.model_executor.models.qwen2:Qwen2Attention.forward":
                "ba0c8dad0d65329549f09b2c2013eccf4c5400920ce5555405f4afa52b112864",
            "vllm.model_executor.models.qwen2:Qwen2MLP.forward":
                "42d88f10393524ea921151398c966da0c14a8f0baa2b2fa3ab9b074f54dcd504",
            "vllm.model_executor.models.llama:LlamaDecoderLayer.forward":
                "71daafe15adcfe3dc71a46d6e3350433d7a0447c06f5b2fcc13d0a399516f481",
            "vllm.model_executor.models.llama:LlamaAttention.forward":
                "4408c421cfca87e35a5000ad1b014f98e7e04e122aba983f6e0ab73a69ca2352",
            "vllm.model_executor.models.llama:LlamaMLP.forward":
                "643e2a950d96a35c2ca6d10436d5409e5c9a5073dfe6c92c91f780330f72bd1f",
            "vllm.model_executor.layers.layernorm:RMSNorm.forward_native":
                "136165e3f2b5444112107ce77f4aa19b73fd5b01aa9786602052adef259c71e4",
            "vllm.ir.ops.layernorm:":
                "65d33dcb96404ddde273acf84ef901151a8155a2cffc144bdd0c49fe1d576a22",
            "vllm.model_executor.layers.rotary_embedding.base:RotaryEmbedding.forward_static":
                "32056fe8f633e8b96e4ab860f2655952746d2e35993621ec02af9bf910541275",
            "vllm.model_executor.layers.rotary_embedding.base:RotaryEmbedding._match_cos_sin_cache_dtype":
                "6dd53b4288fbeab849c01b959c4216fd05c91c86f58457b2b32c5d6c4a2264c6",
            "vllm.model_executor.layers.activation:SiluAndMul.forward_native":
                "075ee4e32ab6e2abd049912b58365caaf0e42811acd70c005a7d7e5a0832bb63",
        },
        "the two ops compute what these forwards compute (add + RMSNorm, QKV with bias, rotary embedding, "
        "o_proj, SiLU-and-mul, down_proj) and read their modules' attributes"),
    Internal(
        "gated_proposer", "omni_platform.spec_proposer", "no default speculation (plain decode)",
        "OMNI_SPECULATION=off",
        {
            "vllm.v1.spec_decode.custom_class_proposer:create_custom_proposer":
                "b090d3960d9f49fac1702c7b577576e0ff9b5b3301ef702bf290d4ef45e2359f",
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids":
                "980d46e41814827a464046a8231ca3b7e379831b67def971483559f26065031f",
        },
        "vLLM builds the proposer from the VllmConfig and calls propose(sampled_token_ids, "
        "num_tokens_no_spec, token_ids_cpu, slot_mappings=...) after each step; the hook is experimental"),
    Internal(
        "api_key_on_every_route", "omni_platform.api_key",
        "the key from VLLM_API_KEY only; with an --api-key on the command line every route but /health refused",
        "none (closed, not open)",
        {
            "vllm.entrypoints.openai.api_server:build_app":
                "d295bb8825221fd0214eb7af5cabbbd39051649a06781b3ab9e69902fe757260",
        },
        "build_app keeps the parsed arguments in app.state.args (api_key: the --api-key list) and adds the "
        "--middleware classes, whose requests carry the app in scope['app']"),
)}
"""Every feature of omni-platform and omni-quant that relies on vLLM internals, by name (docs/stability.md)."""

_VERDICTS: dict[str, list[str]] = {}


def changed(name: str) -> list[str]:
    """What differs for :data:`INTERNALS` ``[name]`` in the vLLM installed: one line per changed or missing
    target, empty when every fingerprint matches. Not cached.

    Raises:
        KeyError: no such internal.
    """
    lines = []
    for target, expected in INTERNALS[name].targets.items():
        try:
            actual = target_fingerprint(target)
        except (LookupError, OSError, TypeError) as e:
            lines.append(f"{target}: {e}")
            continue
        if actual != expected:
            lines.append(f"{target}: fingerprint {actual[:12]} != {expected[:12]} (vLLM 0.28.0)")
    return lines


def holds(name: str) -> bool:
    """Whether the feature ``name`` may rely on vLLM's internals here: every fingerprint matches. Checked
    once per process; on a mismatch one warning names each changed target and the fallback.

    Raises:
        KeyError: no such internal.
    """
    if name not in _VERDICTS:
        _VERDICTS[name] = changed(name)
        if _VERDICTS[name]:
            internal = INTERNALS[name]
            logger.warning("omni: %s (%s) is off: the vLLM code it relies on changed (%s); running %s instead",
                           name, internal.user, "; ".join(_VERDICTS[name]), internal.fallback)
    return not _VERDICTS[name]
