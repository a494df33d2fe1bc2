"""One entry point for the harness: ``python -m harness COMMAND [ARGS]`` (from the repository).

Commands: ``bench`` (harness.grid.bench), ``results`` (harness.artifacts.results), ``models``
(harness.models.registry), ``fidelity`` (harness.models.fidelity), ``ledger`` (harness.memory.ledger),
``profile`` (harness.memory.profile), ``kernels`` (harness.kernels.matrix), ``pages``
(harness.kernels.pages), ``demo`` (harness.demo), ``bpw`` (harness.models.bpw), ``startup``
(harness.startup.run), ``paired`` (harness.paired.run: servers taking turns, judged by paired ratios),
``plot-load`` (harness.load.plot), and the arm runners the specs call: ``run-vllm``, ``run-llamacpp``,
``run-ik-llamacpp``, ``run-openvino``, ``run-spec``, ``run-llama-server``, ``run-load``,
``run-load-openvino`` and ``run-soak`` (servers under load), ``run-kv-residency`` (a server's memory around a
long request), ``run-demo`` (the main job from empty caches, timed).
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "bench": "harness.grid.bench",
    "results": "harness.artifacts.results",
    "models": "harness.models.registry",
    "fidelity": "harness.models.fidelity",
    "ledger": "harness.memory.ledger",
    "profile": "harness.memory.profile",
    "kernels": "harness.kernels.matrix",
    "pages": "harness.kernels.pages",
    "demo": "harness.demo",
    "bpw": "harness.models.bpw",
    "startup": "harness.startup.run",
    "paired": "harness.paired.run",
    "run-vllm": "harness.arms.vllm",
    "run-demo": "harness.arms.demo",
    "run-llamacpp": "harness.arms.llamacpp",
    "run-ik-llamacpp": "harness.arms.ik_llamacpp",
    "run-openvino": "harness.arms.openvino",
    "run-spec": "harness.arms.speculate",
    "run-llama-server": "harness.arms.llama_server",
    "run-load": "harness.load.sweep",
    "run-load-openvino": "harness.load.openvino_cb",
    "run-soak": "harness.load.soak",
    "run-kv-residency": "harness.load.kv_residency",
    "plot-load": "harness.load.plot",
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
