// What every instruction set's kernel shares: the block formats, their repacked layout, and the
// driver that splits one matmul's tiles between threads (included by gguf_matmul.cpp).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
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
// output axis, each repacked by packing.py (16-column tiles). Its tiles are listed once, with the
// running total of their bytes, so that every call can hand threads equal shares of the bytes.
struct MatDesc {
  struct Tile { int kind; const uint8_t* base; int64_t col, n_cols; };
  int64_t n_in = 0;   // set before the first part is added
  int64_t n_out = 0;  // output rows of the parts added so far
  std::vector<Tile> tiles;
  std::vector<int64_t> cost_end;  // bytes of tiles [0, i]
  // The tiles cut into runs of at least kChunkBytes (the last may be shorter): what a thread takes at a
  // time when the threads share the tiles by stealing (TileQueue). chunk_end[c]: the tile after run c.
  static constexpr int64_t kChunkBytes = 64 * 1024;
  std::vector<int64_t> chunk_end;
  void add(const uint8_t* d, int64_t kind, int64_t r) {
    const Layout L = layout(static_cast<int>(kind));
    const int64_t tile_bytes = n_in / L.group_k * L.group_bytes;
    for (int64_t t = 0; t < (r + 15) / 16; ++t) {
      tiles.push_back({static_cast<int>(kind), d + t * tile_bytes, n_out + 16 * t, std::min<int64_t>(16, r - 16 * t)});
      cost_end.push_back((cost_end.empty() ? 0 : cost_end.back()) + tile_bytes);
      const int64_t n = static_cast<int64_t>(tiles.size());
      if (chunk_end.empty() || chunk_bytes(static_cast<int64_t>(chunk_end.size()) - 1) >= kChunkBytes) chunk_end.push_back(n);
      else chunk_end.back() = n;
    }
    n_out += r;
  }
  int64_t chunk_start(int64_t c) const { return c == 0 ? 0 : chunk_end[c - 1]; }
  // Bytes of tiles before the end of run c.
  int64_t chunk_cost_end(int64_t c) const { return cost_end[chunk_end[c] - 1]; }
  int64_t chunk_bytes(int64_t c) const { return chunk_cost_end(c) - (c == 0 ? 0 : chunk_cost_end(c - 1)); }
};

// float -> bfloat16 bits, rounded to nearest even as torch rounds, NaN -> a quiet NaN (every
// variant's scalar bf16 stores; AVX-512's vector store does the same per lane).
inline uint16_t bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return v != v ? 0x7FC0 : static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// Thread th's equal share [lo, hi) of n items among nt threads.
inline void share(int64_t n, int64_t th, int64_t nt, int64_t& lo, int64_t& hi) {
  lo = n * th / nt;
  hi = n * (th + 1) / nt;
}

// The tiles of one matmul, shared between nt threads by stealing. Thread th owns the runs of tiles
// (MatDesc::chunk_end) that make up its equal share of the bytes and takes them front to back; once
// its own are done it takes the others' from their back ends. Which thread runs a tile never changes
// the tile's arithmetic, so the bits are a static split's; what changes is that a thread slowed by the
// other (two cores share the memory bus unevenly) no longer holds it at the next barrier.
class TileQueue {
 public:
  // Before the threads start (one thread): every thread's share of m's runs.
  void reset(const MatDesc& m, int64_t nt) {
    if (nt > cap_) {
      words_.reset(new Word[nt]);
      cap_ = nt;
    }
    nt_ = nt;
    const int64_t n = static_cast<int64_t>(m.chunk_end.size());
    const int64_t total = n ? m.chunk_cost_end(n - 1) : 0;
    int64_t begin = 0;
    for (int64_t th = 0; th < nt; ++th) {
      int64_t end = n;
      if (th < nt - 1) {  // the runs whose bytes end in the thread's share: upper bound of its last byte
        int64_t lo_cost, hi_cost;
        share(total, th, nt, lo_cost, hi_cost);
        int64_t lo = begin, hi = n;
        while (lo < hi) {
          const int64_t mid = (lo + hi) / 2;
          if (m.chunk_cost_end(mid) <= hi_cost) lo = mid + 1;
          else hi = mid;
        }
        end = lo;
      }
      words_[th].v.store(pack(begin, end), std::memory_order_relaxed);
      begin = end;
    }
  }

  // The next run thread th takes: its own from the front, else another's from the back; false when none is left.
  bool next(int64_t th, int64_t& chunk) {
    if (take(words_[th % nt_], true, chunk)) return true;
    for (int64_t k = 1; k < nt_; ++k)
      if (take(words_[(th + k) % nt_], false, chunk)) return true;
    return false;
  }

 private:
  struct alignas(64) Word { std::atomic<uint64_t> v{0}; };  // front | back << 32, in runs; a line each
  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) | (static_cast<uint64_t>(back) << 32);
  }
  static bool take(Word& w, bool front, int64_t& chunk) {
    uint64_t v = w.v.load(std::memory_order_acquire);
    for (;;) {
      const int64_t f = static_cast<int64_t>(v & 0xFFFFFFFFu), b = static_cast<int64_t>(v >> 32);
      if (f >= b) return false;
      const uint64_t next = front ? pack(f + 1, b) : pack(f, b - 1);
      if (w.v.compare_exchange_weak(v, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
        chunk = front ? f : b - 1;
        return true;
      }
    }
  }
  std::unique_ptr<Word[]> words_;
  int64_t cap_ = 0, nt_ = 1;
};

// Thread th's part of y[R, n_out] (row stride ldy, fp32 or bf16) = x @ W^T + bias for activation rows
// already quantized into `a`: the runs of tiles `queue` (reset for m and the thread count) hands it.
// Each row's arithmetic is the body's, in a fixed order, whatever R, the thread count and the split.
template <typename Rows, typename TileFn>
void matmul_share(const Rows& a, int64_t R, const MatDesc& m, const float* bias, void* y, bool bf16_out,
                  int64_t ldy, TileFn (*tile_fn)(int), int64_t th, TileQueue& queue) {
  char* ybase = static_cast<char*>(y);
  const int64_t esize = bf16_out ? 2 : 4;
  int64_t c;
  while (queue.next(th, c)) {
    for (int64_t i = m.chunk_start(c); i < m.chunk_end[c]; ++i) {
      const MatDesc::Tile& t = m.tiles[i];
      const int64_t groups = m.n_in / layout(t.kind).group_k;
      tile_fn(t.kind)(t.base, groups, a, R, t.n_cols, bias ? bias + t.col : nullptr, ybase + t.col * esize, bf16_out, ldy);
    }
  }
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
