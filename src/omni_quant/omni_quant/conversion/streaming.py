"""The calibration forward one decoder layer at a time: memory bounded by a layer, not by the model.

:func:`layerwise_input_sums` gives what a full transformers forward over each calibration text gives
the hooks of :mod:`omni_quant.conversion.calibration` (the sum of x^2 per input channel of every linear layer,
and the number of rows), while holding at most one decoder layer's weights:

1. the model is built with no weights (``accelerate.init_empty_weights``: parameters on the meta
   device; buffers such as RoPE's ``inv_freq`` computed as usual), in bf16 as the old path loaded it;
2. the input embedding is read, every text embedded, the embedding dropped; every other weight
   outside the decoder layers but the output head (the final norm, a few vectors) is read once;
3. for each decoder layer i: its weights are read from the source (:mod:`omni_quant.conversion.tensor_sources`),
   then, for each text, the model's own forward runs with layers 0..i-1 replaced by a replay of what
   layer i-1 returned for that text and stops once layer i has returned (so layer i sees exactly the
   arguments the model gives it: attention mask, position embeddings, per-layer attention type),
   the hooks recording its linear layers' inputs; then its weights go back to the meta device;
4. a last pass per text replays every layer and records the output head's input, then stops: the head's
   weights are never read.

This is the layer-by-layer scheme of GPTQ's reference code (Frantar et al. 2022, ``llama.py``, its
``Catcher``), here driving the model's own forward so the per-layer arguments need no knowledge of the
architecture. A model whose weights the source cannot supply by name (a fused MoE expert tensor, a GGUF
processor that renames tensors) raises :class:`NotLayerwise`, and the caller decides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

__all__ = ["LayerwiseStats", "NotLayerwise", "decoder_layers", "layerwise_input_sums"]

logger = logging.getLogger("omni_quant.conversion.streaming")


class NotLayerwise(ValueError):
    """The model cannot be calibrated one layer at a time from this source; the message says why."""


class _Stop(Exception):
    """Raised from a hook to end a forward once what it was run for has been seen."""


class LayerwiseStats:
    """What one run held: ``layers`` decoder layers walked, ``peak_params`` the most parameter elements
    materialized at once (outside the meta device), ``layer_params`` the largest decoder layer's."""

    def __init__(self):
        self.layers = 0
        self.peak_params = 0
        self.layer_params = 0


def decoder_layers(model: torch.nn.Module, n_layers: int) -> tuple[str, torch.nn.ModuleList]:
    """The ``nn.ModuleList`` of the model's ``n_layers`` decoder layers and its name (``model.layers``).

    Raises:
        NotLayerwise: no module list of that length (or several of equal size)."""
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers]
    if not found:
        raise NotLayerwise(f"no list of {n_layers} decoder layers in {type(model).__name__}")
    sizes = [sum(p.numel() for p in m.parameters()) for _, m in found]
    best = max(sizes)
    if sizes.count(best) > 1:
        raise NotLayerwise(f"{type(model).__name__} has {sizes.count(best)} lists of {n_layers} equal layers")
    return found[sizes.index(best)]


def _set(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    module._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)


def _drop(model: torch.nn.Module, name: str) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    old = module._parameters[leaf]
    module._parameters[leaf] = torch.nn.Parameter(torch.empty(old.shape, dtype=old.dtype, device="meta"),
                                                  requires_grad=False)


def _resident(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.device.type != "meta")


def _source_names(model, params: list[str], source) -> dict[str, str]:
    """Each model parameter name -> the source's name for it: the same name (a GGUF source speaks
    transformers' names), else the checkpoint's name (transformers 5 renames some keys on load; asked of
    ``revert_weight_conversion`` as :func:`omni_quant.conversion.structure.checkpoint_names` does).

    Raises:
        NotLayerwise: a parameter the source does not hold."""
    from transformers.core_model_loading import revert_weight_conversion

    if getattr(model, "_weight_conversions", None) is None:
        from transformers.conversion_mapping import get_model_conversion_mapping

        model._weight_conversions = get_model_conversion_mapping(model, add_legacy=False)
    held, out, probe = source.names(), {}, torch.empty(0, device="meta")
    for name in params:
        if name in held:
            out[name] = name
            continue
        try:
            keys = list(revert_weight_conversion(model, {name: probe}))
        except Exception:  # noqa: BLE001  (a conversion that needs real tensors: not one tensor per parameter)
            keys = []
        if len(keys) != 1 or keys[0] not in held:
            raise NotLayerwise(f"the checkpoint holds no tensor for parameter {name}")
        out[name] = keys[0]
    return out


def _raise_stop(*_args) -> None:
    raise _Stop


def layerwise_input_sums(
    config, source, texts: list[torch.Tensor], watch: Callable[[torch.nn.Module], None] | None = None,
    shape_error: type[Exception] = ValueError,
) -> tuple[dict[str, torch.Tensor], dict[str, int], str, LayerwiseStats]:
    """Sum of x^2 per input channel of every ``torch.nn.Linear`` of the model and of its output head, over
    the token ids ``texts`` (each int64 ``[1, T]``), one decoder layer's weights in memory at a time.

    ``config`` is the transformers config; ``source`` a :mod:`omni_quant.conversion.tensor_sources` source. Returns
    ``(sums, counts, head, stats)``: ``sums`` maps each module's checkpoint name
    (:func:`omni_quant.conversion.structure.checkpoint_names`) to float32 ``[in_features]``, ``counts`` to the rows
    seen; ``head`` is the output head's checkpoint name; ``stats`` what was held. ``watch(model)``, when
    given, is called with each decoder layer's weights in place, before its forwards (tests count what is
    materialized then).

    Raises:
        NotLayerwise: the model or the source does not allow it (see the module docstring).
        shape_error: a tensor's stored shape is not the one the config gives its parameter.
    """
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from omni_quant.conversion.structure import checkpoint_names
    from omni_quant.conversion.tensor_sources import return_freed_heap

    stats = LayerwiseStats()
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.eval()
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers_name, layers = decoder_layers(model, int(text_config.num_hidden_layers))
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embed is None:
        raise NotLayerwise(f"{type(model).__name__} has no output head or no input embedding")
    modules = {m: name for name, m in model.named_modules() if name}
    head_name, embed_name = modules[head], modules[embed]
    saved = checkpoint_names(model)
    params = dict(model.named_parameters())  # a tied head appears once, under the embedding's name
    head_params = {f"{head_name}.{n}" for n, _ in head.named_parameters()}
    wanted = [n for n in params if n not in head_params]  # the head is never run: its input is what counts
    names = _source_names(model, wanted, source)
    for name in wanted:  # every shape first: a contradiction is named before any work
        stored = source.shape(names[name])
        if tuple(stored) != tuple(params[name].shape):
            raise shape_error(f"{names[name]}: stored shape {tuple(stored)}, but the model built from config.json "
                              f"has {name} as {tuple(params[name].shape)}: a tensor's shape contradicts config.json; "
                              "the checkpoint is damaged or its config belongs to another model")

    if not texts:
        return {}, {}, saved[head_name], stats

    def load(param_names):
        for name in param_names:
            _set(model, name, source.get(names[name], params[name].dtype))
        stats.peak_params = max(stats.peak_params, _resident(model))

    layer_of = {}
    for i in range(len(layers)):
        for n, _ in layers[i].named_parameters():
            layer_of[f"{layers_name}.{i}.{n}"] = i
    embed_params = [n for n in wanted if n.startswith(f"{embed_name}.")]
    outside = [n for n in wanted if n not in layer_of and n not in embed_params]

    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    allowed: set[int] = set()

    def grab(name, module):
        def hook(_module, args):
            if id(module) not in allowed:
                return
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            sums[name] = sums.get(name, 0) + x.pow(2).sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]
        return hook

    hooks = [m.register_forward_pre_hook(grab(saved[name], m)) for m, name in modules.items()
             if isinstance(m, torch.nn.Linear) or m is head]
    try:
        with torch.inference_mode():
            load(embed_params)
            embedded = [embed(ids) for ids in texts]
            for n in embed_params:
                _drop(model, n)
            load(outside)
            latest = list(embedded)

            def run(t):  # the model's own forward on text t, until a hook stops it
                try:
                    model(inputs_embeds=embedded[t])
                except _Stop:
                    return
                raise NotLayerwise(f"{type(model).__name__}'s forward ran past the layer it was stopped at")

            for i, layer in enumerate(layers):
                mine = [n for n, j in layer_of.items() if j == i and n in names]
                load(mine)
                stats.layer_params = max(stats.layer_params, sum(params[n].numel() for n in mine))
                if watch is not None:
                    watch(model)
                allowed.clear()
                allowed.update(id(m) for m in layer.modules())
                for t in range(len(texts)):
                    def stop(_module, _args, output, t=t):
                        latest[t] = output
                        raise _Stop
                    for j in range(i):  # layers before i give back what layer i - 1 returned for text t
                        layers[j].forward = (lambda *a, t=t, **k: latest[t])
                    handle = layer.register_forward_hook(stop)
                    try:
                        run(t)
                    finally:
                        handle.remove()
                for n in mine:
                    _drop(model, n)
                return_freed_heap()
                stats.layers += 1
            allowed.clear()
            allowed.update(id(m) for m in model.modules())
            allowed.difference_update(id(m) for m in layers.modules())
            for t in range(len(texts)):
                for j in range(len(layers)):
                    layers[j].forward = (lambda *a, t=t, **k: latest[t])
                handle = head.register_forward_pre_hook(_raise_stop)
                try:
                    run(t)
                finally:
                    handle.remove()
    finally:
        for h in hooks:
            h.remove()
        for layer in layers:
            layer.__dict__.pop("forward", None)
    return sums, counts, saved[head_name], stats
