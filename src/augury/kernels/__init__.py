"""Low-bit matmuls on GGUF blocks: a C++ kernel built at first use, its torch reference and fallback.

`GgufWeight` (weight.py) is what the decoder sees; reference.py defines the
block formats and the kernel's arithmetic in plain torch; packing.py the
kernel's tile layout; extension.py builds and loads the C++ code in csrc/.
"""
