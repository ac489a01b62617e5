// What every instruction set's kernel shares: the block formats, their repacked layout, and the
// driver that splits one matmul's tiles between threads (included by gguf_matmul.cpp).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

// Block formats, numbered as augury/kernels/packing.py numbers them.
enum Kind : int { Q4_0 = 0, Q4_1 = 1, Q5_0 = 2, Q5_1 = 3, Q8_0 = 4, Q4_K = 5, Q5_K = 6, Q6_K = 7 };
constexpr int kNumKinds = 8;

// The repacked layout of one group of one 16-column tile (see kernel_body.h).
struct Layout {
  int group_k;      // `in` values per group
  int subs;         // sub-blocks of 32 `in` values per group
  int sub_bytes;    // quant bytes per sub-block (16 columns x 32 values)
  int group_bytes;  // quants of all sub-blocks, then the group's scales
};

constexpr Layout layout(int kind) {
  switch (kind) {
    case Q4_0: return {32, 1, 256, 256 + 32};            // nibbles | d f16[16]
    case Q4_1: return {32, 1, 256, 256 + 64};            // nibbles | d f16[16] | m f16[16]
    case Q5_0: return {32, 1, 320, 320 + 32};            // nibbles, 5th bits | d
    case Q5_1: return {32, 1, 320, 320 + 64};            // nibbles, 5th bits | d | m
    case Q8_0: return {32, 1, 512, 512 + 32};            // bytes (value + 128) | d
    case Q4_K: return {256, 8, 256, 8 * 256 + 320};      // | sc u8[8][16] m u8[8][16] d f16[16] dmin f16[16]
    case Q5_K: return {256, 8, 320, 8 * 320 + 320};      // same scales as Q4_K
    case Q6_K: return {256, 8, 384, 8 * 384 + 288};      // nibbles, 2 planes of high bits | sc s8[16][16] d f16[16]
  }
  return {0, 0, 0, 0};
}

// The largest unsigned quant of a format (Q8_0: its |value|, up to 128), which bounds how many
// u8 x s8 products an instruction set may sum in 16 bits before widening (AVX2's `dots`).
constexpr int max_quant(int kind) {
  switch (kind) {
    case Q4_0: case Q4_1: case Q4_K: return 15;
    case Q5_0: case Q5_1: case Q5_K: return 31;
    case Q6_K: return 63;
  }
  return 128;
}

// One weight matrix as the kernel sees it: parts of possibly different block kinds stacked on the
// output axis, each repacked by packing.py (16-column tiles).
struct MatDesc {
  std::vector<const uint8_t*> data;
  std::vector<int64_t> kinds, rows;
  int64_t n_in = 0, n_out = 0;
  void add(const uint8_t* d, int64_t kind, int64_t r) { data.push_back(d); kinds.push_back(kind); rows.push_back(r); }
};

// y[R, n_out] (row stride ldy, fp32 or bf16) = x[R, n_in] @ W^T + bias: the activation rows are
// quantized once, then threads take equal shares of the weight bytes, tile by tile. Each row's
// arithmetic is the body's, in a fixed order, whatever R and the thread count.
template <typename Rows, typename TileFn, typename Quantize>
void run_matmul(const float* x, int64_t R, const MatDesc& m, const float* bias, void* y, bool bf16_out, int64_t ldy,
                TileFn (*tile_fn)(int), Quantize quantize) {
  const int64_t n_in = m.n_in, nb = n_in / 32;
  std::vector<int8_t> xq(R * n_in);
  std::vector<float> dx(R * nb), xsum(R * nb);
  std::vector<int32_t> off8(R * nb), off16(R * nb), offq8(R * nb), off32h(2 * R * nb);
  quantize(x, R, n_in, xq.data(), dx.data(), xsum.data(), off8.data(), off16.data(), offq8.data(), off32h.data());
  const Rows a{xq.data(), dx.data(), xsum.data(), off8.data(), off16.data(), offq8.data(), off32h.data(), n_in, nb};

  // Every tile of every part, with its cost in bytes, so threads get equal shares of the bytes.
  struct Tile { int part; int64_t index; };
  std::vector<Tile> tiles;
  std::vector<int64_t> cost_end;
  std::vector<int64_t> col0(m.data.size());
  int64_t cols = 0, total = 0;
  for (size_t p = 0; p < m.data.size(); ++p) {
    col0[p] = cols;
    cols += m.rows[p];
    const Layout L = layout(static_cast<int>(m.kinds[p]));
    const int64_t bytes = n_in / L.group_k * L.group_bytes;
    for (int64_t t = 0; t < (m.rows[p] + 15) / 16; ++t) {
      tiles.push_back({static_cast<int>(p), t});
      total += bytes;
      cost_end.push_back(total);
    }
  }
  char* ybase = static_cast<char*>(y);
  const int64_t esize = bf16_out ? 2 : 4;
  const int64_t nthreads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(tiles.size())));
  at::parallel_for(0, nthreads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t th = begin; th < end; ++th) {
      // Tiles whose cost ends in this thread's share of [0, total).
      const int64_t lo_cost = total * th / nthreads, hi_cost = total * (th + 1) / nthreads;
      auto first = std::upper_bound(cost_end.begin(), cost_end.end(), lo_cost) - cost_end.begin();
      auto last = std::upper_bound(cost_end.begin(), cost_end.end(), hi_cost) - cost_end.begin();
      if (th == nthreads - 1) last = static_cast<int64_t>(tiles.size());
      for (int64_t i = first; i < last; ++i) {
        const Tile& t = tiles[i];
        const int kind = static_cast<int>(m.kinds[t.part]);
        const Layout L = layout(kind);
        const int64_t groups = n_in / L.group_k;
        const uint8_t* base = m.data[t.part] + t.index * groups * L.group_bytes;
        const int64_t c = col0[t.part] + 16 * t.index;
        const int64_t n_cols = std::min<int64_t>(16, m.rows[t.part] - 16 * t.index);
        tile_fn(kind)(base, groups, a, R, n_cols, bias ? bias + c : nullptr, ybase + c * esize, bf16_out, ldy);
      }
    }
  });
}

// One transformer layer's weights and shape (see layer_body.h); optional tensors are null.
struct LayerDesc {
  int64_t hidden = 0, n_heads = 0, n_kv = 0, head_dim = 0, inter = 0;
  float eps = 1e-6f, scale = 1.0f;
  bool gelu = false;  // gelu (tanh) instead of silu
  const float* attn_norm = nullptr;  // [hidden]
  const float* mlp_norm = nullptr;   // [hidden]
  const float* post_attn_norm = nullptr;
  const float* post_mlp_norm = nullptr;
  const float* bqkv = nullptr;  // [(n_heads + 2 n_kv) head_dim]
  const float* q_norm = nullptr;  // [head_dim]
  const float* k_norm = nullptr;
  MatDesc qkv, wo, gate_up, down;
};

// One sequence's keys or values of this layer: [n_kv, slots, head_dim] with element strides.
struct CacheRef {
  void* k;
  void* v;
  int64_t stride_head, stride_slot;
};

// A block of R new rows through one layer: x [R, hidden] fp32 is updated in place. Row r belongs
// to sequence row_seq[r], is written at cache slot row_slot[r], and attends to slots
// [key_lo[r], key_hi[r]) and then extra_slots[extra_off[r] .. extra_off[r + 1]) (a tree's ancestors).
struct LayerIO {
  float* x = nullptr;
  int64_t R = 0;
  std::vector<CacheRef> seqs;
  bool cache_bf16 = true;
  const int64_t* row_seq = nullptr;
  const int64_t* row_slot = nullptr;
  const int64_t* key_lo = nullptr;
  const int64_t* key_hi = nullptr;
  const int64_t* extra_off = nullptr;
  const int64_t* extra_slots = nullptr;
  const float* cos = nullptr;  // [R, head_dim]
  const float* sin = nullptr;
};
