"""The harness's engine recipe, in one place: the settings an arm runs vLLM with, as ``vllm.LLM``
keyword arguments or as ``vllm serve`` arguments (so the two layouts of an arm cannot drift apart).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["EngineRecipe"]


@dataclass(frozen=True)
class EngineRecipe:
    """One engine's settings. ``None`` leaves a setting to vLLM (and to OmniPlatform's defaults)."""

    model: str
    max_num_seqs: int = 8
    max_model_len: int = 1024
    enforce_eager: bool = False
    kv_cache_memory_bytes: int | None = None
    quantization: str | None = None
    max_num_batched_tokens: int | None = None
    inductor_cpp_wrapper: bool = False
    seed: int = 0

    @classmethod
    def from_args(cls, model: str, args: argparse.Namespace, **overrides: Any) -> EngineRecipe:
        """The recipe from a runner's parsed arguments (attributes it lacks keep their defaults)."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if f.name != "model" and hasattr(args, f.name)}
        return cls(model=model, **{**given, **overrides})

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM``."""
        kw: dict[str, Any] = dict(model=self.model, max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
                                  enforce_eager=self.enforce_eager, seed=self.seed)
        for name in ("kv_cache_memory_bytes", "quantization", "max_num_batched_tokens"):
            if getattr(self, name):
                kw[name] = getattr(self, name)
        if self.inductor_cpp_wrapper:
            kw["compilation_config"] = {"inductor_compile_config": {"cpp_wrapper": True}}
        return kw

    def serve_args(self) -> list[str]:
        """The same settings as ``vllm serve`` arguments (after ``serve MODEL``)."""
        out = ["--max-num-seqs", str(self.max_num_seqs), "--max-model-len", str(self.max_model_len),
               "--seed", str(self.seed)]
        if self.enforce_eager:
            out.append("--enforce-eager")
        for name in ("kv_cache_memory_bytes", "quantization", "max_num_batched_tokens"):
            if getattr(self, name):
                out += ["--" + name.replace("_", "-"), str(getattr(self, name))]
        if self.inductor_cpp_wrapper:
            out += ["--compilation-config", json.dumps({"inductor_compile_config": {"cpp_wrapper": True}})]
        return out
