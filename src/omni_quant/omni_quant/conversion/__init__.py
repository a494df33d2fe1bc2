"""The converters: a Hugging Face checkpoint (``checkpoint``) or a GGUF file (``gguf_file``, ``gguf_cache``) to
cpu_int4 or GPTQ, with calibration (``calibration``, ``streaming``) and the ``omni-quant`` command (``cli``).
Runs before vLLM serves; nothing under ``omni_quant.runtime`` imports it."""
