// Included by gguf_matmul.cpp (after ops_avx512.h): one instruction set's vector operations and the
// kernel and layer bodies compiled over them.
#pragma once

// ---------------------------------------------------------------------------------------------
// AVX-512 VNNI with AMX (Intel's tile registers and their int8 matrix multiply, Sapphire Rapids
// on). Everything is AVX-512's (ops_avx512.h) except a sub-block's products for several rows
// (kernel_body.h's tile_rows_matrix): the unpacked quants are already a B tile (VNNI order: the 4
// values of a column in one dword), the rows' int8 values an A tile read straight from the
// quantized activations, and one tdpbsud gives every row's 16 column sums where vpdpbusd takes 8
// instructions a row. The sums are the same exact 32-bit integers and the scaling after them is
// AVX-512's, so this variant's bits are AVX-512's.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")
namespace amx {
namespace ops {

using namespace avx512::ops;  // AVX-512's types and operations (inlined into this target's code)

inline I load_i32(const int32_t* p) { return {_mm512_loadu_si512(p)}; }

// The row count this thread's tile shapes were loaded for (0: unknown). Other code on the same
// threads loads its own shapes (oneDNN's AMX kernels, which torch runs for bf16 matmuls here), so
// every parallel region of this library forgets them at its start (tile_forget).
inline int& tile_rows_loaded() {
  static thread_local int rows = 0;
  return rows;
}
inline void tile_forget() { tile_rows_loaded() = 0; }

// This thread's tile shapes for `rows` activation rows (loaded again only when the count changes),
// two sets that take turns: 0 and 3 A (rows x 32 values), 1 and 4 B (8 x 64 bytes: a sub-block's
// quants), 2 and 5 C (rows x 16 sums).
inline void tile_config(int rows) {
  if (tile_rows_loaded() == rows) return;
  alignas(64) uint8_t cfg[64] = {0};
  cfg[0] = 1;  // palette 1
  auto shape = [&](int t, int r, uint16_t bytes) {
    std::memcpy(cfg + 16 + 2 * t, &bytes, 2);
    cfg[48 + t] = static_cast<uint8_t>(r);
  };
  for (int set = 0; set < 2; ++set) {
    shape(3 * set, rows, 32);
    shape(3 * set + 1, 8, 64);
    shape(3 * set + 2, rows, 64);
  }
  _tile_loadconfig(cfg);
  tile_rows_loaded() = rows;
}

}  // namespace ops
#define AUGURY_MATRIX_UNIT 1
#include "kernel_body.h"
#include "layer_body.h"
#undef AUGURY_MATRIX_UNIT
}  // namespace amx
#pragma GCC pop_options
