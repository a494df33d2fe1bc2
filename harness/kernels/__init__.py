"""Kernel-level measurement: the 4-bit kernel matrix, the huge-page bench, vLLM's W4A8 reference, bits per weight."""
