"""The converter's named recipes: which linear layers get 4 or 8 bits, and whether rounding is
weighted by calibration (``omni-quant convert --recipe NAME``).

4-bit tensors are per-group asymmetric with float zero points at the chosen group size (default
32: 4 bits plus a bf16 scale and zero per 32 weights, 5.0 bits per weight); 8-bit tensors are
symmetric per output channel (8 bits plus one bf16 scale per row, about 8.0). Each recipe's
measured fidelity and bits per weight: docs/cpu_int4.md, the recipe table, each row from its artifact.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_RECIPE", "RECIPES", "Recipe", "recipe_named"]


@dataclass(frozen=True)
class Recipe:
    """One named choice of widths and weighting.

    Attributes:
        name: the ``--recipe`` value.
        body_bits: width of every linear layer but the output head (4 or 8).
        head_bits: width of the output head (4 or 8) when it is quantized.
        weighted: 4-bit rounding weighted by each input channel's E[x^2] over the calibration
            text (:mod:`omni_quant.conversion.calibration`); 8-bit rounding is never weighted (its error is
            256 times smaller at the same range).
        summary: one line for ``--help`` and the report.
        super_blocks: 4-bit layers whose K is a multiple of 256 in super-blocks (Q4_K's arrangement,
            4.625 bits a weight, :mod:`omni_quant.format.super_blocks`), the others per group.
    """

    name: str
    body_bits: int
    head_bits: int
    weighted: bool
    summary: str
    super_blocks: bool = False

    def bits_for(self, module: str, head: str = "lm_head") -> int:
        """The width of checkpoint module ``module``; ``head`` is the output head's checkpoint name
        (``lm_head``, which always means the head, or e.g. GPT-NeoX's ``embed_out``)."""
        return self.head_bits if module in ("lm_head", head) else self.body_bits


RECIPES = {r.name: r for r in (
    Recipe("default", 4, 4, True, "every linear 4-bit, rounding weighted by calibration activations"),
    Recipe("q4", 4, 4, False, "every linear 4-bit, unweighted rounding (no calibration forward)"),
    Recipe("q4-head8", 4, 8, True, "as default, the output head 8-bit (more bits, closer to bf16)"),
    Recipe("q8", 8, 8, False, "every linear 8-bit weight-only, one scale per output channel"),
    Recipe("q4k", 4, 4, True, "every linear 4-bit in super-blocks of 256 (Q4_K's arrangement, 4.625 bits a "
           "weight) where K allows, else group 32; rounding weighted", super_blocks=True),
)}
DEFAULT_RECIPE = "default"


def recipe_named(name: str) -> Recipe:
    """The recipe called ``name``.

    Raises:
        ValueError: no such recipe (the message lists them)."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"--recipe {name} is not one of {', '.join(RECIPES)}") from None
