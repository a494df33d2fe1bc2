"""harness.models.recipe: one recipe, two layouts; vLLM's own CLI parser reads the serve arguments back to
the same engine settings as the vllm.LLM keyword arguments."""

import pytest

from harness.models.recipe import EngineRecipe


@pytest.mark.parametrize("recipe", [
    EngineRecipe("m"),
    EngineRecipe("m", max_num_seqs=2, max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=1 << 28,
                 quantization="cpu_int4", max_num_batched_tokens=512, inductor_cpp_wrapper=True, seed=7),
])
def test_serve_arguments_parse_to_the_llm_keyword_arguments(recipe):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    cli = EngineArgs.from_cli_args(parser.parse_args(["--model", recipe.model, *recipe.serve_args()]))
    kwargs = recipe.llm_kwargs()
    for name, value in kwargs.items():
        got = getattr(cli, name)
        if name == "compilation_config":
            # vllm.LLM builds the same CompilationConfig from the dict; its __post_init__ adds defaults
            # (enable_auto_functionalized_v2) on both paths, so compare the built configs.
            from vllm.config import CompilationConfig

            built = CompilationConfig(**value)
            assert got.inductor_compile_config == built.inductor_compile_config
            assert got.inductor_compile_config["cpp_wrapper"] == value["inductor_compile_config"]["cpp_wrapper"]
        else:
            assert got == value, name
