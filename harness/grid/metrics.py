"""The one registry of metrics: each declares its direction, unit and noise band.

"Best" is decided by the declared direction only, never from the metric's name
(C11: ``tokens_per_s`` is higher-is-better, ``rss_anon_tree_mb`` lower-is-better
because they are declared so). An unknown metric is an error that asks for its
direction to be declared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["Direction", "Metric", "METRICS", "UnknownMetricError", "get_metric"]


class Direction(str, Enum):
    """Which way is better."""

    HIGHER = "higher"
    LOWER = "lower"


@dataclass(frozen=True)
class Metric:
    """A measured quantity.

    ``noise_pct`` is the run-to-run band (percent of the median) inside which two arms
    are not ranked; ``gateable`` says whether ``--check`` may fail a run on it
    (end-to-end throughput on a shared 2-core box is too noisy to gate);
    ``separate_with`` names the tool that can tell two arms apart when the judge finds
    them inside the noise.
    """

    name: str
    direction: Direction
    unit: str
    noise_pct: float
    gateable: bool
    doc: str
    separate_with: str = "python -m harness profile (per-op self time of a decode step)"
    positive: bool = True
    """Valid values are finite and > 0 (a rate, a size, a duration): 0, a negative or a NaN is a
    failed measurement, never a result (a defaulted 0 MiB would win every memory comparison)."""
    one_of: str | None = None
    """A group of metrics of which a pass reports exactly one (``start``: ``start_cold_s`` on the first
    start of an arm's cache, ``start_warm_s`` on later ones); a pass missing every member of a group the
    arm reported elsewhere is a failed pass (:func:`harness.grid.bench.fail_incomplete_passes`)."""

    def invalid(self, value) -> str | None:
        """Why ``value`` is not a measurement of this metric, or None when it is one."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{self.name}={value!r} is not a number"
        if value != value or value in (float("inf"), float("-inf")):
            return f"{self.name}={value!r} is not finite"
        if self.positive and value <= 0:
            return f"{self.name}={value!r} {self.unit} is not positive"
        return None

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is strictly better than ``b``."""
        return a > b if self.direction is Direction.HIGHER else a < b

    def best(self, values: list[float]) -> float:
        """The best of ``values`` by direction."""
        return max(values) if self.direction is Direction.HIGHER else min(values)


class UnknownMetricError(KeyError):
    """A metric name with no declared direction."""

    def __str__(self) -> str:
        name = self.args[0]
        return (
            f"metric {name!r} is not declared in harness/grid/metrics.py; declare it with its "
            f"direction (higher or lower is better), unit and noise band. Known: "
            f"{', '.join(sorted(METRICS))}"
        )


_LEDGER = "python -m harness ledger (what each worker mapping holds, and the unexplained remainder)"
_PHASES = "vLLM's own start-up log (seconds of weight loading, compilation, KV allocation) and more passes"

_KV_KIND = {"anon": "RssAnon", "total": "RssAnon + RssFile + RssShmem"}
_KV_WHEN = {"first": "after its first, short request", "long": "right after a --long-tokens request",
            "after": "seconds after that long request ended"}

_ALL = [
    Metric("tg_tps", Direction.HIGHER, "tok/s", 5.0, False, "decode (text generation) tokens per second, one stream"),
    Metric("tg_host_ms", Direction.LOWER, "ms", 5.0, False,
           "decode wall per token outside omni-quant's W4A8 GEMVs (tg's T(gen_len) - T(1) less the GEMV wall "
           "inside it, per decode token): vLLM's Python, the compiled graph's small kernels, attention, "
           "sampling; not memory-bound, so steadier than tg_tps where the host's bandwidth swings",
           "python -m harness profile (per-op self time of a decode step)"),
    Metric("tg_gemv_ms", Direction.LOWER, "ms", 5.0, False,
           "decode wall per token inside omni-quant's W4A8 GEMVs (omni_quant.kernels.w4a8.linear_clock); "
           "follows the host's memory bandwidth", "the host probe (host_sum_gbs) and more passes"),
    Metric("pp_tps", Direction.HIGHER, "tok/s", 5.0, False, "prefill (prompt processing) tokens per second"),
    Metric("tokens_per_s", Direction.HIGHER, "tok/s", 5.0, False, "generic throughput"),
    Metric("agg_tg_tps", Direction.HIGHER, "tok/s", 5.0, False, "aggregate decode tok/s over concurrent streams"),
    Metric("rss_anon_tree_mb", Direction.LOWER, "MiB", 2.0, True, "sum of RssAnon over the process tree", _LEDGER),
    Metric("rss_file_tree_mb", Direction.LOWER, "MiB", 2.0, True,
           "sum of RssFile over the process tree (resident pages of mapped files: mmap'd weights)", _LEDGER),
    Metric("rss_total_tree_mb", Direction.LOWER, "MiB", 2.0, True,
           "sum of RssAnon + RssFile + RssShmem over the process tree (what the processes hold resident)", _LEDGER),
    Metric("pss_tree_mb", Direction.LOWER, "MiB", 2.0, True,
           "sum of Pss over the process tree at ready: every resident page counted once across the tree "
           "(shared mapped weights, pages shared since a fork)", _LEDGER),
    Metric("peak_anon_tree_mb", Direction.LOWER, "MiB", 3.0, True,
           "largest sampled sum of RssAnon over the process tree from launch to the first token "
           "(harness/memory/peak.py: a lower bound, 50 ms samples)", _LEDGER),
    Metric("peak_total_tree_mb", Direction.LOWER, "MiB", 3.0, True,
           "largest sampled sum of RssAnon + RssFile + RssShmem over the process tree from launch to the "
           "first token", _LEDGER),
    Metric("rss_anon_tree_full_mb", Direction.LOWER, "MiB", 2.0, True, "RssAnon over the tree at full context",
           _LEDGER),
    Metric("rss_anon_worker_mb", Direction.LOWER, "MiB", 2.0, True, "RssAnon of the first worker process at ready",
           _LEDGER),
    Metric("kv_cache_mb", Direction.LOWER, "MiB", 1.0, True,
           "KV cache tensors allocated in the first worker (bytes / 2**20)", _LEDGER),
    *[Metric(f"kv_rss_{kind}_{when}_mb", Direction.LOWER, "MiB", 2.0, True,
             f"tree {_KV_KIND[kind]} of an omni server {_KV_WHEN[when]} (harness/load/kv_residency.py)", _LEDGER)
      for kind, when in (("anon", "first"), ("anon", "long"), ("anon", "after"), ("total", "first"),
                         ("total", "long"))],
    Metric("demo_cold_s", Direction.LOWER, "s", 10.0, False,
           "python -m harness demo (make demo's job) from empty model, compile and omni caches: the bundled model "
           "converted, served, asked, stopped (harness/arms/demo.py)", _PHASES),
    Metric("demo_from_clone_s", Direction.LOWER, "s", 10.0, False,
           "make demo in a fresh git clone with every cache empty (pip's included): the virtual environment set up "
           "from the package index, the bundled model converted, served, asked, stopped (harness/arms/demo.py)",
           _PHASES),
    Metric("start_cold_s", Direction.LOWER, "s", 10.0, False,
           "launch to first token, the arm's cache empty (its first start in the run)", _PHASES, one_of="start"),
    Metric("start_warm_s", Direction.LOWER, "s", 10.0, False,
           "launch to first token, the arm's cache filled by an earlier start", _PHASES, one_of="start"),
    *[m for w in ("edit", "qa", "prose") for m in (
        Metric(f"tg_{w}_tps", Direction.HIGHER, "tok/s", 5.0, False,
               f"decode tokens per second from the first generated token, the {w} workload of "
               "harness/workloads/prompts.py, batch 1, greedy (speculation's gain or loss)"),
        Metric(f"accept_{w}", Direction.HIGHER, "ratio", 5.0, False,
               f"accepted / proposed draft tokens over the {w} workload (vLLM's spec_decode counters; "
               "llama-server's draft_n_accepted / draft_n)", "more passes", positive=False),
        Metric(f"accepted_len_{w}", Direction.HIGHER, "tok/step", 5.0, False,
               f"tokens a verify step emits on average over the {w} workload: 1 + accepted / drafts", "more passes"),
    )],
    *[m for n in (1, 2, 4, 8, 16) for m in (
        Metric(f"load_tps_c{n}", Direction.HIGHER, "tok/s", 5.0, False,
               f"completion tokens / wall seconds of {n} concurrent streams of chat requests (harness/load/sweep.py)",
               "more passes; the server's own step log"),
        Metric(f"ttft_p50_ms_c{n}", Direction.LOWER, "ms", 10.0, False,
               f"median time to the first streamed chunk, {n} concurrent streams", "more passes"),
        Metric(f"ttft_p99_ms_c{n}", Direction.LOWER, "ms", 10.0, False,
               f"99th percentile of the time to the first streamed chunk, {n} concurrent streams", "more passes"),
        Metric(f"itl_p50_ms_c{n}", Direction.LOWER, "ms", 10.0, False,
               f"median gap between streamed chunks, {n} concurrent streams", "more passes"),
        Metric(f"itl_p99_ms_c{n}", Direction.LOWER, "ms", 10.0, False,
               f"99th percentile of the gaps between streamed chunks, {n} concurrent streams", "more passes"),
        Metric(f"tpot_ms_c{n}", Direction.LOWER, "ms", 10.0, False,
               f"time per output token after the first, mean over the requests of {n} concurrent streams: "
               "(last chunk - first chunk) / (completion tokens - 1); unlike itl it counts tokens, not chunks, "
               "so a speculative step's several tokens count as several", "more passes"),
        Metric(f"errors_c{n}", Direction.LOWER, "requests", 0.0, True,
               f"requests of the {n}-stream point without a 200 and a whole answer", "the server's log",
               positive=False),
    )],
    Metric("soak_5xx", Direction.LOWER, "requests", 0.0, True, "5xx answers during a soak (harness/load/soak.py)",
           "the server's log", positive=False),
    Metric("soak_4xx", Direction.LOWER, "requests", 0.0, True, "4xx answers to valid requests during a soak",
           "the server's log", positive=False),
    Metric("soak_errors_other", Direction.LOWER, "requests", 0.0, True,
           "soak requests with no HTTP answer or a broken stream", "the server's log", positive=False),
    Metric("soak_requests", Direction.HIGHER, "requests", 10.0, False, "requests sent during a soak", "more passes"),
    Metric("soak_ttft_p99_ms", Direction.LOWER, "ms", 10.0, False, "99th percentile TTFT of a soak's streamed requests",
           "the soak's windows"),
    Metric("soak_rss_slope_kib_per_req", Direction.LOWER, "KiB/request", 10.0, False,
           "least-squares slope of the server tree's RssAnon against finished requests after the warm-up",
           "python -m harness ledger", positive=False),
    Metric("soak_same_text", Direction.HIGHER, "1 = same", 0.0, True,
           "a known greedy request's text after the soak equals its text before (1) or not (0)", "the server's log",
           positive=False),
    Metric("op_self_us", Direction.LOWER, "us", 5.0, True, "per-op self time of a decode step"),
    Metric("step_wall_us", Direction.LOWER, "us", 5.0, True, "wall time of a decode step without the profiler"),
    Metric("seconds", Direction.LOWER, "s", 5.0, False, "generic wall time", "more passes on idle cores"),
]

METRICS: dict[str, Metric] = {m.name: m for m in _ALL}


def get_metric(name: str) -> Metric:
    """The declared metric ``name``.

    Raises:
        UnknownMetricError: ``name`` is not declared.
    """
    try:
        return METRICS[name]
    except KeyError:
        raise UnknownMetricError(name) from None
