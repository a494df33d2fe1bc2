"""omni-quant: weight-only 4-bit quantization (``cpu_int4``) for vLLM on CPU."""

__all__ = ["__version__"]

__version__ = "0.1.0"
