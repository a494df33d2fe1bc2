"""The compiled kernels' revision, readable without importing torch (the harness records it in every artifact)."""

__all__ = ["KERNEL_REVISION"]

KERNEL_REVISION = 8
"""Bumped when the compiled kernels change speed or results: part of the key of cached
measurements (:mod:`omni_quant.runtime.kernel_choice`). 2: AVX-512 dequantization. 3: AVX2 kernel with
int16 sums and 4-row assembly, vectorized activation quantization. 4: a decode row's activations
quantized in pieces across the threads. 5: AVX-512 prefill in 8-row steps and 64-row tiles, two
accumulators a row, the codes' offset in the accumulator's start, no prefetch past 16 rows.
6: the super-block layout (``omni_quant.kernels.w4a8.linear_super_blocks``). 7: its AVX-512 VNNI kernel; AVX-512
dequantization 32 input channels a step (both layouts). 8: the AVX2 super-block kernel takes each
super-block once per block and row tile (constants unpacked once, codes L1-resident across the tile)."""
