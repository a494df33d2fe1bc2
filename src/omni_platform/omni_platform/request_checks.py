"""Token ids a request carries, checked against the model's vocabulary before the engine sees them.

vLLM 0.28 checks prompt token ids against the tokenizer only when one is loaded, and never
checks ``stop_token_ids``, ``allowed_token_ids`` or ``logit_bias`` keys. An id at or beyond
the vocabulary reaches the model (an embedding lookup out of range) or the sampler, and
fails inside the engine core: with vLLM's own layout the engine core dies for every client
(C12); with the engine core in the calling process (OmniPlatform's small-machine layout)
the request is left half-scheduled. OmniPlatform runs :func:`check_token_ids` from the
published ``Platform.validate_request`` hook (``vllm/v1/engine/input_processor.py``),
which runs in the front end before the request is queued: the OpenAI server answers 400
naming the field and the vocabulary size, ``vllm.LLM`` raises :class:`TokenIdOutOfRange`
(a ``ValueError``) and the engine keeps serving.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm.exceptions import VLLMValidationError

__all__ = ["TokenIdOutOfRange", "check_token_ids"]


class TokenIdOutOfRange(VLLMValidationError, ValueError):
    """A token id outside ``[0, vocab_size)``; ``parameter`` names the request field."""


def _first_bad(ids: Iterable[Any] | None, vocab_size: int) -> Any | None:
    for i in ids or ():
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < vocab_size:
            return i
    return None


def check_token_ids(processed_inputs: Any, params: Any, vocab_size: int) -> None:
    """Raise :class:`TokenIdOutOfRange` for the first token id outside ``[0, vocab_size)``.

    Args:
        processed_inputs: vLLM's ``EngineInput`` (a dict; ``enc_dec`` inputs hold an
            ``encoder_prompt`` and a ``decoder_prompt``), each with ``prompt_token_ids``.
        params: ``SamplingParams`` (``stop_token_ids``, ``allowed_token_ids``,
            ``logit_bias`` keys and the token ids of ``bad_words`` are checked) or
            ``PoolingParams`` (prompt only).
        vocab_size: the model's vocabulary size (``ModelConfig.get_vocab_size()``).
    """
    prompts = [processed_inputs]
    if isinstance(processed_inputs, dict) and processed_inputs.get("type") == "enc_dec":
        prompts = [processed_inputs.get("encoder_prompt"), processed_inputs.get("decoder_prompt")]
    fields: list[tuple[str, Iterable[Any] | None]] = [
        ("prompt_token_ids", p.get("prompt_token_ids")) for p in prompts if isinstance(p, dict)
    ]
    fields += [
        ("stop_token_ids", getattr(params, "stop_token_ids", None)),
        ("allowed_token_ids", getattr(params, "allowed_token_ids", None)),
        ("logit_bias", list((getattr(params, "logit_bias", None) or {}).keys())),
        # bad_words arrive as strings; the ids vLLM tokenized them into, when it did already
        ("bad_words", [i for word in (getattr(params, "_bad_words_token_ids", None) or ()) for i in word]),
    ]
    for name, ids in fields:
        bad = _first_bad(ids, vocab_size)
        if bad is not None:
            raise TokenIdOutOfRange(
                f"{name} holds token id {bad!r}, outside this model's vocabulary of {vocab_size} "
                f"(valid ids are 0..{vocab_size - 1})",
                parameter=name,
                value=bad,
            )
