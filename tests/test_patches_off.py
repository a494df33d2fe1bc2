"""Each patch switched off by its own ``OMNI_PATCH_*_OFF=1``: the upstream behaviour it fixes is
observed; with every patch on, it is not. No engine starts: one interpreter per switch builds the
tiny Llama's engine config as ``vllm.LLM`` would and drives the patched vLLM functions directly.

The engine-level counterparts (and the patches whose bug needs a running engine: the AOT cache
load, the memory release) are in ``test_patches_engine.py``; the model-info cache is in
``test_patch_modelinfo_cache.py``. docs/stability.md lists, per patch, the test that shows its bug.
"""

import functools
import textwrap

import pytest

from conftest import clean_env, run_probe
from skips import MORE_CORES_THAN_FEW

MiB = 1 << 20

PROBE = textwrap.dedent("""
    import json, sys, traceback, types
    import torch
    from omni_patches import apply_all
    applied = apply_all()

    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from omni_platform import envs
    from omni_platform.layout import small_machine_batch_defaults
    from omni_platform.platform import _allowed_physical_cores

    # what vllm.LLM(model, ...) builds, with VLLM_CPU_KVCACHE_SPACE=1 in the environment
    config = EngineArgs(model=sys.argv[1], skip_tokenizer_init=True, enforce_eager=True, max_model_len=256,
                        dtype="float32", kv_cache_memory_bytes=256 << 20).create_engine_config(UsageContext.LLM_CLASS)
    vocab = config.model_config.get_vocab_size()
    out = {"applied": applied, "vocab": vocab,
           "small_machine": small_machine_batch_defaults(_allowed_physical_cores(), envs.OMNI_FEW_CPUS),
           "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
           "max_num_seqs": config.scheduler_config.max_num_seqs,
           "kv_cache_memory_bytes": config.cache_config.kv_cache_memory_bytes}

    # token ids: vLLM's InputProcessor._validate_params on a request with an out-of-vocabulary id
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    class Tokenizer:  # what SamplingParams.verify asks of one: its length
        def __len__(self):
            return vocab

    processor = types.SimpleNamespace(model_config=config.model_config, speculative_config=None,
                                      structured_outputs_config=None, tokenizer=Tokenizer(), vllm_config=config)
    out["token_ids"] = {}
    for field, params in (("allowed_token_ids", SamplingParams(allowed_token_ids=[5, vocab])),
                          ("logit_bias", SamplingParams(logit_bias={vocab + 7: 1.0}))):
        try:
            InputProcessor._validate_params(processor, params, ("generate",))
            out["token_ids"][field] = None
        except Exception as e:
            out["token_ids"][field] = {"type": type(e).__name__, "value_error": isinstance(e, ValueError),
                                       "msg": str(e)}

    # pipeline parallel: a later stage's runner after the eager warm-up, then the first request's
    # receive of the previous stage's hidden states (GPUModelRunner.sync_and_gather_intermediate_tensors)
    import vllm.distributed.parallel_state as parallel_state
    from vllm.config import CompilationMode
    from vllm.model_executor.models.utils import make_empty_intermediate_tensors_factory
    from vllm.sequence import IntermediateTensors
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    parallel_state.get_pp_group = lambda: types.SimpleNamespace(is_first_rank=False, rank_in_group=1)
    hidden = config.model_config.get_hidden_size()
    keys = ["hidden_states", "residual"]
    runner = types.SimpleNamespace(
        vllm_config=config, model_config=config.model_config, device=torch.device("cpu"),
        max_num_tokens=config.scheduler_config.max_num_batched_tokens, intermediate_tensors=None,
        model=types.SimpleNamespace(make_empty_intermediate_tensors=make_empty_intermediate_tensors_factory(keys,
                                                                                                           hidden)))
    CPUModelRunner.warming_up_model(runner)
    received = IntermediateTensors({k: torch.ones(4, hidden) for k in keys})
    pp = {"eager": config.compilation_config.mode == CompilationMode.NONE,
          "allocated_at_warm_up": runner.intermediate_tensors is not None}
    try:
        got = GPUModelRunner.sync_and_gather_intermediate_tensors(runner, 4, received, True)
        pp.update(error=None, shape=list(got["hidden_states"].shape), received=bool((got["residual"] == 1).all()))
    except AssertionError as e:
        pp.update(error=traceback.extract_tb(e.__traceback__)[-1].line)  # the failing assert's source line
    out["pipeline_parallel"] = pp

    # sampler seeds: a seeded row beside an unseeded one, under three global seeds
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    sampler = TopKTopPSampler()
    out["seeded_row"] = []
    for global_seed in (1, 2, 3):
        torch.manual_seed(global_seed)  # the unseeded row draws from here
        logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0))
        tokens, _ = sampler.forward(logits, {0: torch.Generator().manual_seed(1234)}, None, None)
        out["seeded_row"].append(tokens.tolist()[0])
    print("PROBE " + json.dumps(out), flush=True)
""")


@pytest.fixture(scope="module")
def probe(tiny_llama):
    """``probe(switch)``: the probe's result with ``switch=1`` (None: every patch on); each run once."""
    @functools.cache
    def run(switch: str | None) -> dict:
        env = clean_env(VLLM_PLUGINS="omni", VLLM_CPU_KVCACHE_SPACE="1", **({switch: "1"} if switch else {}))
        return run_probe(PROBE, [str(tiny_llama)], env)

    return run


def _off(probe, switch: str, name: str) -> dict:
    off = probe(switch)
    from omni_patches.patches import all_patches

    assert name not in off["applied"] and len(off["applied"]) == len(all_patches()) - 1, off["applied"]
    assert name in probe(None)["applied"]
    return off


def test_batch_defaults_off_gives_vllm_llm_the_large_cpu_defaults(probe):
    """Not a bug: vllm.LLM reaches no published hook, so without the patch it gets vLLM's CPU
    defaults (4096 tokens, 256 sequences) on a small machine too."""
    MORE_CORES_THAN_FEW.skip_if_holds()  # the step budget default applies on machines with <= 4 cores
    on = probe(None)
    assert on["small_machine"] is not None, on
    off = _off(probe, "OMNI_PATCH_BATCH_DEFAULTS_OFF", "_patch_cpu_small_machine_batch_defaults")
    assert (off["max_num_batched_tokens"], off["max_num_seqs"]) == (4096, 256)
    assert (on["max_num_batched_tokens"], on["max_num_seqs"]) == tuple(on["small_machine"]) == (512, 8)


def test_c01_kv_cache_off_lets_vllm_cpu_kvcache_space_overwrite_the_explicit_budget(probe):
    off = _off(probe, "OMNI_PATCH_KV_CACHE_OFF", "_patch_cpu_explicit_kv_cache_memory")
    assert off["kv_cache_memory_bytes"] == 1 << 30, "VLLM_CPU_KVCACHE_SPACE=1 (GiB) won"
    assert probe(None)["kv_cache_memory_bytes"] == 256 * MiB, "the explicit kv_cache_memory_bytes wins"


def test_c12_token_ids_off_gives_vllms_error_that_is_no_value_error(probe):
    off = _off(probe, "OMNI_PATCH_TOKEN_IDS_OFF", "_patch_token_ids_before_verify")
    vocab = off["vocab"]
    for field, err in off["token_ids"].items():
        assert err["type"] == "VLLMValidationError" and not err["value_error"], (field, err)
    msg = off["token_ids"]["allowed_token_ids"]["msg"]
    assert msg.startswith("allowed_token_ids contains out-of-vocab token id!") and "vocabulary" not in msg, msg
    for field, bad in (("allowed_token_ids", vocab), ("logit_bias", vocab + 7)):
        err = probe(None)["token_ids"][field]
        assert err["type"] == "TokenIdOutOfRange" and err["value_error"], (field, err)
        assert f"{field} holds token id {bad}, outside this model's vocabulary of {vocab}" in err["msg"], err


def test_c17_pipeline_parallel_off_a_later_stage_fails_at_its_first_request_in_eager_mode(probe):
    off = _off(probe, "OMNI_PATCH_PIPELINE_PARALLEL_OFF", "_patch_cpu_pipeline_parallel_eager")
    assert off["pipeline_parallel"]["eager"] and not off["pipeline_parallel"]["allocated_at_warm_up"]
    assert off["pipeline_parallel"]["error"] == "assert self.intermediate_tensors is not None"
    on = probe(None)["pipeline_parallel"]
    assert on["allocated_at_warm_up"] and on["error"] is None and on["received"], on
    assert on["shape"][0] == 4


def test_c15_sampler_seeds_off_a_seeded_row_follows_the_global_generator(probe):
    off = _off(probe, "OMNI_PATCH_SAMPLER_SEEDS_OFF", "_patch_cpu_sampler_seeds")
    assert len(set(off["seeded_row"])) > 1, off["seeded_row"]
    assert len(set(probe(None)["seeded_row"])) == 1, probe(None)["seeded_row"]
