"""``_patch_token_ids_before_verify``: an out-of-vocabulary id in a request's sampling fields is a
``ValueError`` naming the field and the vocabulary size, offline as on the server (C12).

vLLM 0.28 checks ``allowed_token_ids`` and ``logit_bias`` keys in ``SamplingParams.verify``, called
from ``InputProcessor._validate_params`` (``vllm/v1/engine/input_processor.py``) before the
platform's ``validate_request`` hook, where OmniPlatform checks every id
(:mod:`omni_platform.request_checks`). Its error is a ``VLLMValidationError``, which is not a
``ValueError`` in 0.28, and for ``allowed_token_ids`` names no vocabulary size ("allowed_token_ids
contains out-of-vocab token id!"). The replacement runs omni's check of the sampling fields (``stop_token_ids``,
``allowed_token_ids``, ``logit_bias`` keys) first, then the original: the error is omni's
``TokenIdOutOfRange`` (both a ``VLLMValidationError``, so the server still answers 400, and a
``ValueError``). Requests without a bad id take the original path unchanged.
"""

from __future__ import annotations

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

NAME = "_patch_token_ids_before_verify"


def _make(original):
    def _validate_params(self, params, supported_tasks) -> None:
        from vllm.sampling_params import SamplingParams

        from omni_platform.request_checks import check_token_ids

        if isinstance(params, SamplingParams):
            check_token_ids({}, params, self.model_config.get_vocab_size())  # no prompt here: the hook checks it
        original(self, params, supported_tasks)

    setattr(_validate_params, MARKER, NAME)
    _validate_params.__wrapped_original__ = original
    return [_validate_params]


PATCH = Patch(
    name=NAME,
    targets={"vllm.v1.engine.input_processor:InputProcessor._validate_params":
             "7911653a3a812f311f23694d2919661f78fc2e7407b428fb59914f96110a39a4"},
    make=_make,
    disable_env="OMNI_PATCH_TOKEN_IDS_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/v1/engine/input_processor.py:InputProcessor._validate_params`',
    bug=('`SamplingParams.verify` checks `allowed_token_ids` and `logit_bias` keys before the '
         "platform's `validate_request` hook, with a `VLLMValidationError` (not a `ValueError` in vLLM"
         " 0.28; for `allowed_token_ids` it names no vocabulary size); the replacement runs omni's "
         'check of the sampling fields first (C12)'),
    switch_doc='`OMNI_PATCH_TOKEN_IDS_OFF=1`',
    bug_test='`tests/test_patches_off.py::test_c12_token_ids_off_gives_vllms_error_that_is_no_value_error`',
    fix_test=('the same test; in an engine '
              '`tests/test_request_checks.py::test_c12_vllm_llm_refuses_bad_ids_and_keeps_generating`'),
)
