"""OmniPlatform: vLLM's CPU platform with defaults that work on small machines.

A subclass of ``vllm.platforms.cpu.CpuPlatform`` (vLLM 0.28). It overrides only
classmethods of vLLM's published ``Platform`` interface, calls ``super()`` first,
changes a setting only while the user left it to vLLM, and logs every choice with the
value chosen and why:

- thread binding (:mod:`omni_platform.binding`): ``VLLM_CPU_OMP_THREADS_BIND`` from the
  process's CPU affinity, no reserved core on small machines, CPUs split among local
  workers (so ``tensor_parallel_size=2`` starts on one NUMA node);
- KV cache budget (:mod:`omni_platform.kv_budget`): ``kv_cache_memory_bytes`` from
  ``max_model_len`` x ``max_num_seqs`` when neither it nor ``VLLM_CPU_KVCACHE_SPACE``
  is set;
- process layout (:mod:`omni_platform.layout`): on a small machine with one worker,
  the worker runs inside the engine core (``vllm.LLM`` in one process, the OpenAI
  server in two), with the torch thread count set before vLLM freezes it;
- step budget (:mod:`omni_platform.layout`): ``--max-num-batched-tokens`` and
  ``--max-num-seqs`` defaults for ``vllm serve`` on a small machine, through the
  published ``pre_register_and_update(parser)`` hook (``vllm.LLM`` gets the same
  defaults from omni-patches, since no published hook sees its arguments);
- vLLM IR op priority: omni's CPU ``rms_norm`` providers first when the model runs
  eager (or ``OMNI_IR_CPU_NORMS=1``);
- attention (:mod:`omni_platform.attention`): vLLM's CPU attention with the KV cache write inside,
  one custom op per layer (``OMNI_CPU_ATTN_ONE_OP=0`` gives vLLM's two).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.platforms.cpu import CpuPlatform

from omni_platform import envs
from omni_platform.binding import BindingError, CpuCore, plan_binding
from omni_platform.kv_budget import plan_kv_cache_bytes
from omni_platform.layout import plan_layout, small_machine_batch_defaults

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kernel import IrOpPriorityConfig
    from vllm.utils.argparse_utils import FlexibleArgumentParser

__all__ = ["OmniPlatform"]

logger = init_logger("vllm.omni_platform.platform")



def _auto_set() -> set[str]:
    return {v for v in envs.OMNI_AUTO_SET.split(",") if v}


def _user_set(name: str) -> bool:
    """Whether the user (not OmniPlatform in an earlier pass) set environment variable ``name``."""
    return os.environ.get(name, "") != "" and name not in _auto_set()


def _user_set_at_launch(name: str) -> bool:
    """Whether environment variable ``name`` was in this process's environment when it was executed
    (``/proc/self/environ``, which ``os.environ`` changes do not touch) and not set by OmniPlatform in
    the process that launched it. vLLM's CLI sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` itself before
    any plugin loads (``cli_env_setup``, ``vllm/entrypoints/serve/utils/api_utils.py``, 0.28), so
    ``os.environ`` cannot tell that default from a user's choice. Where ``/proc`` is unreadable, any
    value counts as the user's."""
    try:
        with open("/proc/self/environ", "rb") as f:
            launch = {kv.split(b"=", 1)[0].decode(errors="replace") for kv in f.read().split(b"\0") if kv}
    except OSError:
        return _user_set(name)
    return name in launch and name not in _auto_set()


def _launched_as_openai_server() -> bool:
    """Whether this process is vLLM's OpenAI server started from the command line: ``vllm serve`` or
    ``omni-vllm serve`` (``sys.argv[0]`` named ``vllm``/``omni-vllm``, or vLLM's CLI module, with
    ``serve`` first), or ``python -m vllm.entrypoints.openai.api_server``."""
    argv = sys.argv or [""]
    first = argv[0].replace(os.sep, "/")
    cli = os.path.basename(first) in ("vllm", "omni-vllm") or first.endswith("vllm/entrypoints/cli/main.py")
    return (cli and len(argv) > 1 and argv[1] == "serve") or first.endswith("vllm/entrypoints/openai/api_server.py")


def _mark_auto_set(name: str, value: str) -> None:
    os.environ[name] = value
    os.environ["OMNI_AUTO_SET"] = ",".join(sorted(_auto_set() | {name}))


class OmniPlatform(CpuPlatform):
    """vLLM's ``CpuPlatform`` with small-machine defaults (see the module docstring).

    Activated by the ``omni`` entry point in ``vllm.platform_plugins`` only where
    vLLM's own CPU platform would activate.
    """

    _vocab_size: int | None = None
    """The vocabulary size of the model this process configured (for :meth:`validate_request`)."""

    @classmethod
    def validate_request(cls, processed_inputs, params) -> None:
        """vLLM's checks, then every token id of the request against the vocabulary.

        Raises:
            omni_platform.request_checks.TokenIdOutOfRange: a prompt id, ``stop_token_ids``,
                ``allowed_token_ids`` or ``logit_bias`` key outside ``[0, vocab_size)``
                (a ``ValueError``; the OpenAI server answers 400).
        """
        super().validate_request(processed_inputs, params)
        if cls._vocab_size is not None:
            from omni_platform.request_checks import check_token_ids

            check_token_ids(processed_inputs, params, cls._vocab_size)

    @classmethod
    def pre_register_and_update(cls, parser: FlexibleArgumentParser | None = None) -> None:
        """On a small machine, lower the CLI defaults of ``--max-num-batched-tokens`` and ``--max-num-seqs``.

        vLLM calls this hook with the ``vllm serve`` parser (``AsyncEngineArgs.add_cli_args``,
        vLLM 0.28) and without one from ``create_engine_config``. A flag given on the command
        line always wins over a parser default.
        """
        super().pre_register_and_update(parser)
        if parser is None:
            return
        defaults = small_machine_batch_defaults(_allowed_physical_cores(), envs.OMNI_FEW_CPUS)
        if defaults is None:
            return
        tokens, seqs = defaults
        if _batch_defaults_answered_by_vllm():
            # vLLM's own default path gives the step budget (EngineArgs.get_batch_defaults answers with omni's
            # numbers) and raises it to max_model_len for a model that cannot chunk its prefill (an
            # encoder-only pooling model, C30); a parser default would bypass that.
            parser.set_defaults(max_num_seqs=seqs)
        else:
            parser.set_defaults(max_num_batched_tokens=tokens, max_num_seqs=seqs)
        logger.info_once(
            "omni: default --max-num-batched-tokens %d --max-num-seqs %d (small machine, <= "
            "OMNI_FEW_CPUS=%d cores: smaller compiled warm-up); pass either flag to override",
            tokens, seqs, envs.OMNI_FEW_CPUS,
        )

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        """Choose the process layout, apply vLLM's CPU defaults, then omni's thread binding and KV budget.

        Raises:
            BindingError: the allowed CPUs cannot host the local workers.
            KvBudgetError: not one ``max_model_len`` sequence fits the automatic budget.
        """
        kv_space_env = _user_set("VLLM_CPU_KVCACHE_SPACE")
        explicit_kv = vllm_config.cache_config.kv_cache_memory_bytes
        if vllm_config.model_config is not None:
            cls._vocab_size = vllm_config.model_config.get_vocab_size()
        in_process = cls._configure_process_layout(vllm_config)  # before super(): it rewrites uni to mp
        user_start_method = _user_set_at_launch("VLLM_WORKER_MULTIPROC_METHOD")  # super() sets it to spawn
        super().check_and_update_config(vllm_config)
        cls._configure_thread_binding(vllm_config)
        if in_process:
            cls._configure_in_process_threads()
            cls._configure_engine_core_start(user_start_method)
        cls._configure_kv_cache(vllm_config, explicit_kv, kv_space_env)
        cls._configure_attention_kv_split()
        if envs.OMNI_CPU_ATTN_ONE_OP and isinstance(vllm_config.additional_config, dict):
            # The compiled graph differs (no unified_kv_cache_update op): key the compile cache by it.
            vllm_config.additional_config["omni_cpu_attn_one_op"] = True
        if isinstance(vllm_config.additional_config, dict):
            # Inductor's C++ is generated for the vector ISA it picks (the CPU's, lowered by
            # ATEN_CPU_CAPABILITY); vLLM's compile hash has no CPU factor, so a cache filled on an AVX-512
            # host would be loaded on an AVX2 one (C20). additional_config is part of that hash.
            vllm_config.additional_config.setdefault("omni_cpu_isa", compile_isa_key())
        if envs.is_set("OMNI_INT4_KERNEL") and isinstance(vllm_config.additional_config, dict):
            # cpu_int4 layers call a different op per kernel: a graph compiled for one must not be
            # reloaded for the other. (The measured prefill row count is read at run time.)
            vllm_config.additional_config["omni_int4_kernel"] = envs.OMNI_INT4_KERNEL

    @classmethod
    def _configure_process_layout(cls, vllm_config: VllmConfig) -> bool:
        """Run the worker inside the engine core where :func:`plan_layout` says so; True if it does."""
        parallel = vllm_config.parallel_config
        user_mp = (os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
                   if _user_set("VLLM_ENABLE_V1_MULTIPROCESSING") else None)
        plan = plan_layout(
            world_size=parallel.world_size,
            data_parallel_size=parallel.data_parallel_size,
            executor_backend=parallel.distributed_executor_backend,
            user_multiprocessing=user_mp,
            user_threads_bind=_user_set("VLLM_CPU_OMP_THREADS_BIND"),
            physical_cores=_allowed_physical_cores(),
            few_cpus=envs.OMNI_FEW_CPUS,
        )
        already = "VLLM_ENABLE_V1_MULTIPROCESSING" in _auto_set()
        if plan.in_process:
            _mark_auto_set("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            parallel.distributed_executor_backend = "uni"
        if not already:
            logger.info(
                "omni: process layout: %s because %s; override with VLLM_ENABLE_V1_MULTIPROCESSING=1 "
                "or distributed_executor_backend='mp'",
                "worker inside the engine core (vllm.LLM: 1 process, OpenAI server: 2)"
                if plan.in_process else "vLLM's (front end, engine core, worker processes)",
                plan.reason,
            )
        return plan.in_process

    @classmethod
    def _configure_in_process_threads(cls) -> None:
        """Set the torch thread count for a worker that runs in this process's engine core.

        vLLM's ``mp`` executor gives each worker ``OMP_NUM_THREADS`` and its CPU list
        (``vllm/utils/ompmultiprocessing.py``); the ``uni`` executor sets nothing, and the
        CPU worker turns ``torch.set_num_threads`` into a no-op once it starts
        (``v1/worker/cpu_worker.py``, vLLM 0.28), so the count is set here, before it.
        ``OMP_NUM_THREADS`` is exported too, for an engine core process spawned later.
        """
        import torch

        cpus = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
        n = _allowed_physical_cores()
        if _user_set("OMP_NUM_THREADS"):
            logger.info("omni: torch threads left to the user: OMP_NUM_THREADS=%s", os.environ["OMP_NUM_THREADS"])
            return
        _mark_auto_set("OMP_NUM_THREADS", str(n))
        torch.set_num_threads(n)
        logger.info("omni: %d torch threads for the in-process worker (cpus %s)", n, cpus)

    @classmethod
    def _configure_engine_core_start(cls, user_set: bool) -> None:
        """Fork the server's engine core instead of spawning it, where the worker runs inside it and
        ``OMNI_ENGINE_CORE_FORK=1`` asks for it.

        vLLM's ``CpuPlatform.check_and_update_config`` sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``
        (``vllm/platforms/cpu.py``, 0.28), so the engine core process starts a new interpreter and
        imports vLLM, torch and transformers again before it loads a weight: 5.59 s of a 17.87 s warm
        start of SmolLM2's server on a 2-core EPYC, 11.85 s forked (``python -m harness startup --server``;
        ``harness/results/startup_smollm2-135m-int4_server_warm{_spawn,}-*.json``, docs/startup.md).
        vLLM's own default elsewhere is ``fork``, which it gives up only when CUDA
        or XPU is initialised, under Ray, NUMA binding or WSL (``_maybe_force_spawn`` in
        ``vllm/utils/system_utils.py``): none holds for the one engine-core child of this layout.
        What does hold on CPU is GNU OpenMP: a process that forks after running a parallel region
        leaves the child's thread pool unusable, and the engine core hangs at its first parallel
        region (the CPU worker's thread binding). The server's front end started from the command
        line runs none before it forks: vLLM's CLI and omni's hooks run no torch op there
        (``torch.set_num_threads`` only sets the count), and ``omni-vllm serve FILE.gguf`` converts in
        a child interpreter (``omni_quant.conversion.gguf_cache``). So the fork is the default there and only
        there (:func:`_launched_as_openai_server`): a user's own process that builds an engine may have
        run one. The mp layout (several workers) keeps spawn. ``user_set``: the user's environment named
        a start method (:func:`_user_set_at_launch`).
        """
        if user_set:
            return
        if not envs.OMNI_ENGINE_CORE_FORK or not _launched_as_openai_server():
            return
        if "VLLM_WORKER_MULTIPROC_METHOD" not in _auto_set():
            logger.info("omni: the OpenAI server forks its engine core (VLLM_WORKER_MULTIPROC_METHOD=fork): "
                        "no second import of vLLM; OMNI_ENGINE_CORE_FORK=0 spawns it as vLLM does")
        _mark_auto_set("VLLM_WORKER_MULTIPROC_METHOD", "fork")

    @classmethod
    def _configure_attention_kv_split(cls) -> None:
        """``VLLM_CPU_ATTN_SPLIT_KV=0`` unless the user set it: a request's attention is computed the same
        way whatever else is in the step, so greedy output does not depend on the batch or on speculation.

        vLLM's CPU attention (``vllm/v1/attention/backends/cpu_attn.py``, 0.28) builds its work items with
        ``enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV`` (default 1): when a step has fewer requests than
        threads it splits one sequence's KV among threads and merges their partial softmax sums, so the
        order of the float sums, and at a near-tie the greedy token, depends on how many requests share the
        step. On SmolLM2 int4 (eager, 200 greedy tokens, a one-off run) the split made several of 16
        concurrent requests differ from the same request alone, and ngram speculation change outputs;
        with it off none did (issue 33; ``tests/test_batch_invariance.py`` holds the second half). The cost
        is attention on one thread per sequence when fewer sequences than threads run (docs/speculation.md
        measures it).
        """
        name = "VLLM_CPU_ATTN_SPLIT_KV"
        if _user_set(name):
            logger.info("omni: %s=%s left to the user", name, os.environ[name])
            return
        if name not in _auto_set():
            logger.info("omni: %s=0: a request's attention does not depend on the other requests of its step "
                        "(greedy output equal alone, batched and with speculation); %s=1 restores vLLM's split",
                        name, name)
        _mark_auto_set(name, "0")

    @classmethod
    def _configure_thread_binding(cls, vllm_config: VllmConfig) -> None:
        if "VLLM_CPU_OMP_THREADS_BIND" in _auto_set() and os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
            current = os.environ["VLLM_CPU_OMP_THREADS_BIND"]
            if current.count("|") + 1 == vllm_config.parallel_config.local_world_size:
                return  # chosen by an earlier pass (this process or the one that spawned it)
        if _user_set("VLLM_CPU_OMP_THREADS_BIND"):
            logger.info(
                "omni: thread binding left to the user: VLLM_CPU_OMP_THREADS_BIND=%r",
                os.environ["VLLM_CPU_OMP_THREADS_BIND"],
            )
            return
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list

        allowed = [CpuCore(c.id, c.physical_core) for c in get_allowed_cpu_list()]
        local_world_size = vllm_config.parallel_config.local_world_size
        try:
            plan = plan_binding(allowed, local_world_size, envs.OMNI_FEW_CPUS)
        except BindingError as e:
            raise BindingError(f"OmniPlatform cannot bind worker threads: {e}") from e
        _mark_auto_set("VLLM_CPU_OMP_THREADS_BIND", plan.threads_bind)
        if not _user_set("VLLM_CPU_NUM_OF_RESERVED_CPU"):
            _mark_auto_set("VLLM_CPU_NUM_OF_RESERVED_CPU", str(len(plan.reserved)))
        logger.info(
            "omni: VLLM_CPU_OMP_THREADS_BIND=%r (reserved cpus %s) because %s",
            plan.threads_bind,
            list(plan.reserved),
            plan.reason,
        )

    @classmethod
    def _configure_kv_cache(
        cls, vllm_config: VllmConfig, explicit_kv: int | None, kv_space_env: bool
    ) -> None:
        cache_config = vllm_config.cache_config
        if explicit_kv is not None and str(explicit_kv) == os.environ.get("OMNI_AUTO_KV_CACHE_MEMORY_BYTES"):
            return  # chosen by an earlier pass (vLLM re-checks the config in the engine core)
        if explicit_kv is not None:
            logger.info(
                "omni: KV cache budget set by the user: kv_cache_memory_bytes=%d", explicit_kv
            )
            return
        if kv_space_env:
            logger.info(
                "omni: KV cache budget set by the user: VLLM_CPU_KVCACHE_SPACE=%s GiB",
                os.environ["VLLM_CPU_KVCACHE_SPACE"],
            )
            return
        model_config = vllm_config.model_config
        if model_config is None:
            return
        if model_config.use_mla or model_config.is_hybrid or model_config.is_attention_free:
            logger.info(
                "omni: KV cache budget left to vLLM (gpu_memory_utilization=%s): "
                "MLA, hybrid and attention-free models are sized by vLLM",
                cache_config.gpu_memory_utilization,
            )
            return
        budget = plan_kv_cache_bytes(
            bytes_per_block=_bytes_per_block(vllm_config),
            block_size=cache_config.block_size,
            max_model_len=model_config.max_model_len,
            max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
            available_bytes=_available_node_memory(),
            max_fraction=envs.OMNI_KV_CACHE_MAX_FRACTION,
            max_bytes=envs.OMNI_KV_CACHE_MAX_MIB * (1 << 20) or None,
        )
        cache_config.kv_cache_memory_bytes = budget.bytes
        _mark_auto_set("OMNI_AUTO_KV_CACHE_MEMORY_BYTES", str(budget.bytes))
        logger.info(
            "omni: kv_cache_memory_bytes=%d (%d blocks) sized from %s; neither "
            "kv_cache_memory_bytes nor VLLM_CPU_KVCACHE_SPACE was set",
            budget.bytes,
            budget.num_blocks,
            budget.reason,
        )

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads: int | None = None) -> str:
        """vLLM's CPU choice, except that vLLM's CPU attention becomes the same attention with the KV write
        inside (:mod:`omni_platform.attention`) unless ``OMNI_CPU_ATTN_ONE_OP=0`` or the vLLM code it mirrors
        changed (:func:`omni_platform.internals.holds`, which logs what changed)."""
        path = super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        from omni_platform import internals

        if (envs.OMNI_CPU_ATTN_ONE_OP and path == AttentionBackendEnum.CPU_ATTN.get_path()
                and internals.holds("attention_one_op")):
            logger.info_once("omni: attention backend OmniCpuAttentionBackend, one op per layer "
                             "(OMNI_CPU_ATTN_ONE_OP=0 gives vLLM's two)")
            return "omni_platform.attention.OmniCpuAttentionBackend"
        return path

    @classmethod
    def import_ir_kernels(cls) -> None:
        """Import vLLM's IR kernels, then omni's CPU providers (:mod:`omni_platform.ir_kernels`)."""
        super().import_ir_kernels()
        import omni_platform.ir_kernels  # noqa: F401

    @classmethod
    def get_default_ir_op_priority(cls, vllm_config: VllmConfig) -> IrOpPriorityConfig:
        """``["omni_cpu", "native"]`` for both norms where omni's C++ norms pay, else vLLM's.

        ``OMNI_IR_CPU_NORMS`` decides when set. Unset: on when the model runs eager
        (``compilation_config.mode`` NONE, e.g. ``enforce_eager``), where each native norm is
        several small ops (measured: ``harness/specs/fast_path_options.json``, arms
        ``llm-eager`` and ``llm-eager-cpu_norms``); off in compiled mode, where inductor fuses
        the native norms itself.
        """
        on, why = cls._cpu_norms(vllm_config)
        if not on:
            return super().get_default_ir_op_priority(vllm_config)
        from vllm.config.kernel import IrOpPriorityConfig

        cls.import_ir_kernels()
        logger.info_once("omni: IR op priority omni_cpu, native for rms_norm and fused_add_rms_norm (%s); "
                         "OMNI_IR_CPU_NORMS=0 turns it off", why)
        return IrOpPriorityConfig.with_default(["omni_cpu", "native"])

    @staticmethod
    def _cpu_norms(vllm_config: VllmConfig | None) -> tuple[bool, str]:
        if envs.is_set("OMNI_IR_CPU_NORMS"):
            return envs.OMNI_IR_CPU_NORMS, f"OMNI_IR_CPU_NORMS={os.environ['OMNI_IR_CPU_NORMS']}"
        if vllm_config is None:
            return False, "no config"
        from vllm.config import CompilationMode

        if vllm_config.compilation_config.mode == CompilationMode.NONE:
            return True, "the model runs eager"
        return False, "compiled mode fuses the native norms"


def compile_isa_key() -> str:
    """What decides the vector ISA of the code torch's Inductor generates on this CPU, as one string:
    ATen's CPU capability (``torch.backends.cpu.get_cpu_capability()``: the best the CPU has, or lower when
    ``ATEN_CPU_CAPABILITY`` says so; Inductor's ``pick_vec_isa`` follows the same variable) and whether the CPU
    has AMX tiles (Inductor's ``VecAMX``), e.g. ``"AVX512|amx=0"``. Part of vLLM's compile hash through
    ``additional_config`` (C20)."""
    import torch

    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return f"{torch.backends.cpu.get_cpu_capability()}|amx={int('amx_tile' in flags)}"


def _batch_defaults_answered_by_vllm() -> bool:
    """Whether vLLM's ``EngineArgs.get_batch_defaults`` already answers with omni's small-machine step budget
    (omni-patches' ``_patch_cpu_small_machine_batch_defaults`` is applied in this process: the replacement
    carries the ``__omni_patch__`` marker). Read from vLLM's class, not by importing omni-patches."""
    from vllm.engine.arg_utils import EngineArgs

    fn = getattr(EngineArgs.get_batch_defaults, "__func__", EngineArgs.get_batch_defaults)
    return getattr(fn, "__omni_patch__", None) == "_patch_cpu_small_machine_batch_defaults"


def _allowed_physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (vLLM's own ``lscpu`` reading)."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list

    return len({c.physical_core for c in get_allowed_cpu_list()})


def _bytes_per_block(vllm_config: VllmConfig) -> int:
    """Bytes of one KV block on one worker: layers x 2 (K, V) x block_size x kv_heads x head_size x dtype."""
    import torch
    from vllm.utils.torch_utils import get_kv_cache_torch_dtype

    model_config = vllm_config.model_config
    parallel_config = vllm_config.parallel_config
    dtype = get_kv_cache_torch_dtype(vllm_config.cache_config.cache_dtype, model_config.dtype)
    element = torch.tensor([], dtype=dtype).element_size()
    return (
        model_config.get_num_layers(parallel_config)
        * 2
        * vllm_config.cache_config.block_size
        * model_config.get_num_kv_heads(parallel_config)
        * model_config.get_head_size()
        * element
    )


def _available_node_memory() -> int:
    """Available bytes on the NUMA node of the first allowed CPU, as vLLM's CPU worker reads it."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    node = get_allowed_cpu_list()[0].numa_node
    return get_memory_node_info(node).available_memory
