"""What runs inside vLLM: the ``cpu_int4`` quantization method (``config``), its linear and embedding layers,
the kernel choice per layer shape, weights mapped from the layout cache, the fused decoder layers. Imports
the format and the kernels, never the converter."""
