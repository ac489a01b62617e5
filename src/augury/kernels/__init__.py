"""Low-bit matmuls on GGUF blocks: a C++ kernel built at first use, its torch reference and fallback.

`GgufWeight` (weight.py) is what the decoder sees; reference.py defines the
block formats and the kernel's arithmetic in plain torch; packing.py the
kernel's tile layout; extension.py builds and loads the C++ code in csrc/;
bench.py times one forward's matmuls of a real GGUF by row count.

The choice: int8 activations and VNNI, not bf16 activations. A decode step
reads each weight once and a verification block multiplies it with a few
rows, so the cost per extra row is arithmetic. AVX-512 VNNI's vpdpbusd does 64
multiply-adds (u8 quants x s8 activations) per instruction and, measured on
the development CPU (Xeon, AVX-512 VNNI/BF16), issues two per cycle, as many
as vfmadd; vdpbf16ps does 32, and would also need each 4-bit quant widened to
bf16 first. So int8 costs about half the instructions per row. Quants are
unsigned in every format (Q4_K 0..15 suits u8 x s8; Q6_K, Q4_0, Q5_0 and
Q8_0's offsets become an integer correction from the row's quant sums).

The numerical effect: each activation row is rounded to int8 per block of 32
values (scale = block amax / 127, as llama.cpp's Q8_0 activations; per 32
rather than Q8_K's 256 so that one outlier costs only its own block), and the
kernel then computes x_hat @ W^T exactly in integers per sub-block, combined
in fp32. So the error against the fp32 matmul on the dequantized weights is at
most sum_k |w_k| * dx / 2 per output (reference.error_bound; tests hold the
kernel to it), about 1% of the largest output on random data; on the 1.5B the
one prompt checked continued greedily exactly as on the bf16 path (16 tokens).
Every row is computed on its own in a fixed order, so results are bitwise
the same for any number of rows and threads: no row padding is needed.

Measured (Qwen2.5-Coder-1.5B Q4_K_M, all 28 layers' matmuls plus the head,
1.0 GB of blocks against 3.1 GB of bf16, one thread, process CPU time on a
shared and busy 2-core machine, `python -m augury.kernels.bench ...
--threads 1 --cpu-time`): 1 row 84 ms (11.8 GB/s), 2 rows 90 ms (1.06x),
5 rows 100 ms (1.18x), 8 rows 114 ms (1.35x), 32 rows 330 ms; oneDNN's bf16
(prepacked, AMX-bf16 on that CPU) 238 ms for 1 to 16 rows, 336 ms for 32.
Large row counts (prefill) are compute bound at about 130-150 G multiply-adds
per second per core in the kernel; a CPU with AMX runs oneDNN's bf16 matmul
about 3x faster. So blocks of more than 64 tokens (weight.PREFILL_ROWS)
multiply bf16 weights dequantized tile by tile in C++ (0.26 ns a weight, about
0.35 s per forward of the 1.5B on one core) with torch's matmul: 256 rows
1.56 s against bf16's 1.03 s and the kernel's 3.15 s; 65 rows 1.00 s against
bf16's 0.46 s (there the kernel, 0.70 s at 64 rows, would be faster: the
crossover is near 100 rows on this CPU).
"""
