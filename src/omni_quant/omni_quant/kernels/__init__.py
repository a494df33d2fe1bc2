"""omni's own CPU kernels: the compiled ``_w4a8`` extension (csrc/, one file per instruction set) and its
Python binding (``w4a8``: which instruction set this CPU runs, the torch ops it registers)."""
