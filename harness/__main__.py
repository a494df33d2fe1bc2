"""One entry point for the harness: ``python -m harness COMMAND [ARGS]`` (from the repository).

Commands: ``bench`` (harness.bench_harness), ``results`` (harness.results), ``models``
(harness.models), ``fidelity`` (harness.fidelity), ``ledger`` (harness.memory_ledger),
``profile`` (harness.profile_step), ``kernels`` (harness.kernel_bench), ``pages``
(harness.page_bench), ``demo`` (harness.demo), ``bpw`` (harness.bpw),
and the arm runners the specs call: ``run-vllm``, ``run-llamacpp``, ``run-openvino``.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "bench": "harness.bench_harness",
    "results": "harness.results",
    "models": "harness.models",
    "fidelity": "harness.fidelity",
    "ledger": "harness.memory_ledger",
    "profile": "harness.profile_step",
    "kernels": "harness.kernel_bench",
    "pages": "harness.page_bench",
    "demo": "harness.demo",
    "bpw": "harness.bpw",
    "run-vllm": "harness.run_vllm",
    "run-llamacpp": "harness.run_llamacpp",
    "run-openvino": "harness.run_openvino",
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the command's ``main(argv)``; exit 2 with the list on an unknown command."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m harness {" + ",".join(COMMANDS) + "} [args]", file=sys.stderr)
        return 2 if argv and argv[0] not in ("-h", "--help") else 0
    module = importlib.import_module(COMMANDS[argv[0]])
    sys.argv = [f"python -m harness {argv[0]}", *argv[1:]]
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
