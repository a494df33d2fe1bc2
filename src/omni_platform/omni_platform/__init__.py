"""omni-platform: the OmniPlatform vLLM platform plugin and omni's activation of extensions.

Importing this package imports nothing of vLLM; vLLM reaches the plugin through the
entry points declared in ``pyproject.toml`` (see :mod:`omni_platform._plugin`).
"""

from importlib import metadata as _metadata

__all__ = [
    "EXTENSION_GROUP",
    "PLATFORM_QUALNAME",
    "__version__",
]

from omni_platform._plugin import PLATFORM_QUALNAME
from omni_platform.extensions import EXTENSION_GROUP

__version__ = _metadata.version("omni-platform")  # the one version source: pyproject.toml
