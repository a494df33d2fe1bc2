"""omni-quant: weight-only 4-bit quantization (``cpu_int4``) for vLLM on CPU."""

from importlib import metadata as _metadata

__all__ = ["__version__"]

from omni_quant import settings as _settings  # noqa: F401  (declares omni-quant's settings)

__version__ = _metadata.version("omni-quant")  # the one version source: pyproject.toml
