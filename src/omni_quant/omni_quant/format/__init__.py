"""The cpu_int4 format: how 4-bit codes, scales and super-blocks are laid out and computed on, on disk and in
memory (packing, the quantization math, Q4_K-style super-blocks, llama.cpp's GGUF blocks, the mapped layout
file). Imports nothing else of omni-quant: the converter and the runtime both build on it."""
