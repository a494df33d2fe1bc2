"""Run one real vLLM engine in this process (as a user script would) and report as JSON.

Usage: ``python tests/engine_probe.py CONFIG_JSON``. CONFIG_JSON has ``llm`` (keyword
arguments of ``vllm.LLM``), ``prompts`` (strings, or lists of token ids) and
``max_tokens``. The last line of stdout is ``ENGINE_PROBE_RESULT {json}`` with the
greedy ``token_ids`` and ``texts`` of each prompt, this process's ``pid``, and
``workers`` (``omni_platform.probe.worker_report`` from each worker).
Nothing of omni is imported before the engine exists, so activation happens through
vLLM's plugin mechanism alone.
"""

import json
import os
import sys

if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**config["llm"])
    prompts = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in config["prompts"]]
    params = SamplingParams(temperature=0.0, max_tokens=config.get("max_tokens", 16))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    workers = None
    try:
        from omni_platform.probe import worker_report
    except ImportError:  # omni-platform not installed: report nothing from the workers
        pass
    else:
        workers = llm.collective_rpc(worker_report)
    result = {
        "pid": os.getpid(),
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        "workers": workers,
    }
    print("ENGINE_PROBE_RESULT " + json.dumps(result), flush=True)
