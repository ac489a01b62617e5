"""Low-bit matmuls on GGUF blocks: a C++ kernel built at first use, its torch reference and fallback.

`GgufWeight` (weight.py) is what the decoder sees; reference.py defines the
block formats and the kernel's arithmetic in plain torch; packing.py the
kernel's tile layout; extension.py builds and loads the C++ code in csrc/;
bench.py times one forward's matmuls of a real GGUF by row count.

The choice: int8 activations and VNNI, not bf16 activations. A decode step
reads each weight once and a verification block multiplies it with a few
rows, so the cost per extra row is arithmetic. AVX-512 VNNI's vpdpbusd does 64
multiply-adds (u8 quants x s8 activations) per instruction, vdpbf16ps 32, and
the latter would also need each 4-bit quant widened to bf16 first; so int8
costs about half the instructions per row. Quants are unsigned in every format
(Q4_K 0..15 suits u8 x s8; Q6_K, Q4_0, Q5_0 and Q8_0's offsets become an
integer correction from the row's quant sums).

The numerical effect: each activation row is rounded to int8 per block of 32
values (scale = block amax / 127, as llama.cpp's Q8_0 activations; per 32
rather than Q8_K's 256 so that one outlier costs only its own block), and the
kernel then computes x_hat @ W^T exactly in integers per sub-block, combined
in fp32. So the error against the fp32 matmul on the dequantized weights is at
most sum_k |w_k| * dx / 2 per output (reference.error_bound; tests hold the
kernel to it). Every row is computed on its own in a fixed order, so results
are bitwise the same for any number of rows and threads: no row padding is
needed.

Prefill: large row counts are compute bound, so blocks of more than
`weight.PREFILL_ROWS` tokens multiply bf16 weights dequantized tile by tile in
C++ with torch's matmul instead. What the kernel and that path measured, and
on which machine, is in docs/benchmarks.md (section 6a).
"""
