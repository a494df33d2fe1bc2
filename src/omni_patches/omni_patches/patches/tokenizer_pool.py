"""``_patch_tokenizer_pool_in_background``: the renderer's tokenizer copies are made after start-up.

Upstream behaviour (vLLM 0.28.0, ``vllm/tokenizers/hf.py``, ``maybe_make_thread_pool``, called by
``HfRenderer.__init__`` in ``vllm/renderers/hf.py`` with ``renderer_num_workers + 1`` copies): to
make a fast tokenizer thread-safe, every public call borrows one of a pool of deep copies; the pool
is filled with ``copies`` deep copies before the renderer exists, and a borrower that finds it empty
makes one more. A deep copy of a fast tokenizer is a serialisation and parse of its whole
``tokenizer.json``: the two copies are about 1.4 s of every start of Qwen2.5-Coder-1.5B (151k tokens;
a py-spy profile of a warm ``vllm.LLM`` start, docs/startup.md), on the path to the first token.

The replacement calls the original with no copies, so the renderer is ready at once. Where the
engine core is a process of its own (the OpenAI server: its front end only waits while the engine
core starts) it makes the ``copies`` deep copies in a daemon thread (``omni-tokenizer-pool``),
adding each to the same pool as it is done. Where the engine runs in this process
(omni's ``vllm.LLM`` layout: no running event loop,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) a background copy would hold the
GIL the engine's start needs (measured: the seconds moved into the engine's init), so no copy is
made ahead: a borrower does what upstream's borrower does when the pool is empty, makes a copy of
its own and returns it to the pool (the chat template warm-up makes the first, one copy instead of
two). The pool is found in the closure of
the pooled class's methods (``_borrow_from_pool`` and its ``tokenizer_pool``/``og_tokenizer`` cells);
when that shape is not there (another tokenizer kind: nothing was pooled) the original's result is
returned as it is.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH", "pool_of"]

logger = logging.getLogger("vllm.omni_patches.tokenizer_pool")
NAME = "_patch_tokenizer_pool_in_background"


def _cells(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))


def pool_of(tokenizer):
    """``(queue.Queue, tokenizer)``: the pool and the template tokenizer of a pooled tokenizer, else None."""
    method = type(tokenizer).__dict__.get("decode")
    if method is None or not hasattr(method, "__code__"):
        return None
    borrow = _cells(method).get("_borrow_from_pool")
    inner = getattr(getattr(borrow, "cell_contents", None), "__wrapped__", None)  # under @contextmanager
    if inner is None:
        return None
    cells = _cells(inner)
    if "tokenizer_pool" not in cells or "og_tokenizer" not in cells:
        return None
    return cells["tokenizer_pool"].cell_contents, cells["og_tokenizer"].cell_contents


def _engine_core_elsewhere() -> bool:
    """Whether this renderer's engine core is another process: an ``AsyncLLM`` (always a client of an engine
    core process; it is built inside a running event loop, the OpenAI server's) or an ``LLMEngine`` with
    ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` (omni's ``vllm.LLM`` layout sets 0)."""
    import asyncio

    import vllm.envs as vllm_envs

    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return bool(vllm_envs.VLLM_ENABLE_V1_MULTIPROCESSING)


def _fill(pool, template, copies: int) -> None:
    try:
        for _ in range(copies):
            pool.put(copy.deepcopy(template))
    except Exception:  # a borrower makes its own copy when the pool is empty: nothing is lost
        logger.exception("omni-patches: a tokenizer copy for the renderer's pool failed; borrowers copy on demand")


def _make(maybe_make_thread_pool):
    @functools.wraps(maybe_make_thread_pool)
    def wrapper(tokenizer, copies: int = 1):
        pooled = maybe_make_thread_pool(tokenizer, 0)
        found = pool_of(pooled) if copies > 0 else None
        if found is None:  # nothing pooled, or a shape this patch does not know: borrowers copy on demand
            return pooled
        if not _engine_core_elsewhere():  # the engine runs in this process: no idle time
            logger.info("omni-patches: the renderer's tokenizer copies are made when first borrowed (the engine "
                        "core runs in this process; OMNI_PATCH_TOKENIZER_POOL_OFF=1 makes %d before start-up goes on)",
                        copies)
            return pooled
        pool, template = found
        threading.Thread(target=_fill, args=(pool, template, copies), name="omni-tokenizer-pool",
                         daemon=True).start()
        logger.info("omni-patches: the renderer's %d tokenizer copies are made in the background "
                    "(OMNI_PATCH_TOKENIZER_POOL_OFF=1 makes them before start-up goes on)", copies)
        return pooled

    setattr(wrapper, MARKER, NAME)
    return [wrapper]


PATCH = Patch(
    name=NAME,
    targets={"vllm.renderers.hf:maybe_make_thread_pool":
             "dc84d008e1ddfdf7405ef67fbce45c69f2c8138407dadeb6dd7f3c173b02f347"},
    make=_make,
    disable_env="OMNI_PATCH_TOKENIZER_POOL_OFF",
    doc=__doc__.split("\n")[0],
    where=("`vllm/renderers/hf.py:maybe_make_thread_pool` (vLLM's `vllm/tokenizers/hf.py` function, as"
           ' the renderer imported it)'),
    bug=('not a bug: the renderer makes `renderer_num_workers + 1` deep copies of a fast tokenizer '
         'before start-up goes on, each a serialisation and parse of its `tokenizer.json`. The '
         'replacement makes none then: where the engine core is a process of its own (the server) a '
         'daemon thread fills the same pool while the front end waits for the engine core; in the '
         "one-process `vllm.LLM` layout a borrower makes a copy when the pool is empty, as upstream's "
         "borrower does (a background copy there holds the GIL the engine's start needs)"),
    switch_doc='`OMNI_PATCH_TOKENIZER_POOL_OFF=1`',
    bug_test=('not a bug: '
              '`tests/test_tokenizer_pool.py::test_with_the_switch_set_vllm_makes_its_copies_before_it_returns`'
              " (vLLM's function left in place, its pool full when it returns)"),
    fix_test=('`tests/test_tokenizer_pool.py::test_the_pool_is_filled_in_the_background_or_on_demand` '
              "(SmolLM2's real tokenizer: the pool filled by the thread, or by the first borrower; the"
              ' same ids and text)'),
)
