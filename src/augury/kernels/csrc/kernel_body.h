// The GGUF matmul kernel, written once over a small set of vector operations (namespace `ops`).
//
// gguf_matmul.cpp includes this file twice, inside `#pragma GCC target` regions for
// AVX-512 (VNNI) and for AVX2, each time after defining `ops` for that instruction set,
// so both variants run the same loop with the same arithmetic and order.
//
// Layout (see augury/kernels/packing.py, which writes it): a weight matrix is cut into
// tiles of 16 output columns; a tile stores its groups (256 `in` values for the K
// formats, 32 for the others) one after another, and a group holds, per sub-block of
// 32 `in` values, 8 vectors of unpacked quants in VNNI order (vector g, byte 4c + i =
// quant of column c at in-offset 4g + i), 4-bit planes packed two vectors per 64 bytes
// (low nibble: vector p, high nibble: vector p + 4), 5th/6th bits as extra planes, then
// the per-column scales of the group.
//
// Arithmetic per activation row r, column tile and sub-block j (see reference.py):
//   i   = sum_k q[c, k] * xq[r, k] - zero * sum_k xq[r, k]        (int32, exact)
//   acc = fma(float(i) * dx[r, j], scale[c, j], acc)               (fp32)
//   acc = fma(min[c, j], dx[r, j] * sum_k xq[r, k], acc)           (formats with a min)
// (Q6_K, with two 16-value sub-blocks per 32: t = fma(float(i1), scale1, float(i0) * scale0),
// acc = fma(t, dx, acc)),
// in ascending j, independently of the other rows: a row's result does not depend on
// how many rows share the call.

namespace body {

using ops::F;
using ops::I;

// Quantized activation rows (shared by all tiles of a call).
struct Rows {
  const int8_t* xq;     // [R][n_in]
  const float* dx;      // [R][nb32]
  const float* xsum;    // [R][nb32]  dx * sum of xq over each 32 (the dequantized block's sum)
  const int32_t* off8;  // [R][nb32]  -8 * sum of xq over each 32
  const int32_t* off16; // [R][nb32]  -16 * ...
  const int32_t* offq8; // [R][nb32]  -ops::kQ8Zero * ...
  const int32_t* off32h;// [R][2 * nb32]  -32 * sum of xq over each 16
  int64_t n_in;
  int64_t nb32;
};

// The buffers behind a Rows view, sized once for the widest input (no allocation per call once
// grown). Threads may quantize different blocks of one view at once: blocks are independent.
struct QuantBuffers {
  std::vector<int8_t> xq;
  std::vector<float> dx, xsum;
  std::vector<int32_t> off8, off16, offq8, off32h;

  // Room for R rows of up to max_in values (call before any thread uses the buffers).
  void reserve(int64_t R, int64_t max_in) {
    const int64_t nb = max_in / 32;
    if (static_cast<int64_t>(xq.size()) < R * max_in) xq.resize(R * max_in);
    if (static_cast<int64_t>(dx.size()) < R * nb)
      for (auto* v : {&dx, &xsum}) v->resize(R * nb);
    if (static_cast<int64_t>(off8.size()) < R * nb) {
      for (auto* v : {&off8, &off16, &offq8}) v->resize(R * nb);
      off32h.resize(2 * R * nb);
    }
  }

  // The view of rows of n_in values, once every (row, block) of them is quantized.
  Rows rows(int64_t n_in) const {
    return {xq.data(), dx.data(), xsum.data(), off8.data(), off16.data(), offq8.data(), off32h.data(), n_in, n_in / 32};
  }

  // Block b (32 values at xb, fp32) of row r of n_in values: dx = amax / 127, xq = round-half-even(x * (127 / amax)).
  void quantize(int64_t n_in, const float* xb, int64_t r, int64_t b) {
    const float amax = ops::amax32(xb);
    const float d = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t s0 = 0, s1 = 0;
    ops::quant32(xb, inv, xq.data() + r * n_in + b * 32, &s0, &s1);
    const int64_t i = r * (n_in / 32) + b;
    dx[i] = d;
    xsum[i] = d * static_cast<float>(s0 + s1);
    off8[i] = -8 * (s0 + s1);
    off16[i] = -16 * (s0 + s1);
    offq8[i] = -ops::kQ8Zero * (s0 + s1);
    off32h[2 * i] = -32 * s0;
    off32h[2 * i + 1] = -32 * s1;
  }
};

template <int SHIFT>
static inline I shift16(I v) {
  if constexpr (SHIFT > 0) return ops::sll16<SHIFT>(v);
  else if constexpr (SHIFT < 0) return ops::srl16<-SHIFT>(v);
  else return v;
}

// The 8 quant vectors of one sub-block; `p` points at its packed bytes.
template <int KIND>
static inline void unpack(const uint8_t* p, I* w) {
  if constexpr (KIND == Q8_0) {
    for (int g = 0; g < 8; ++g) w[g] = ops::load(p + 64 * g);
  } else {
    const I nib = ops::set1_u8(0x0F);
    for (int i = 0; i < 4; ++i) {
      const I v = ops::load(p + 64 * i);
      w[i] = ops::and_(v, nib);
      w[i + 4] = ops::and_(ops::srl16<4>(v), nib);
    }
    if constexpr (KIND == Q5_0 || KIND == Q5_1 || KIND == Q5_K) {
      const I h = ops::load(p + 256);
      const I bit = ops::set1_u8(0x10);
      w[0] = ops::or_and(w[0], shift16<4>(h), bit);
      w[1] = ops::or_and(w[1], shift16<3>(h), bit);
      w[2] = ops::or_and(w[2], shift16<2>(h), bit);
      w[3] = ops::or_and(w[3], shift16<1>(h), bit);
      w[4] = ops::or_and(w[4], h, bit);
      w[5] = ops::or_and(w[5], shift16<-1>(h), bit);
      w[6] = ops::or_and(w[6], shift16<-2>(h), bit);
      w[7] = ops::or_and(w[7], shift16<-3>(h), bit);
    }
    if constexpr (KIND == Q6_K) {
      const I h0 = ops::load(p + 256), h1 = ops::load(p + 320);
      const I bits = ops::set1_u8(0x30);
      w[0] = ops::or_and(w[0], shift16<4>(h0), bits);
      w[1] = ops::or_and(w[1], shift16<2>(h0), bits);
      w[2] = ops::or_and(w[2], h0, bits);
      w[3] = ops::or_and(w[3], shift16<-2>(h0), bits);
      w[4] = ops::or_and(w[4], shift16<4>(h1), bits);
      w[5] = ops::or_and(w[5], shift16<2>(h1), bits);
      w[6] = ops::or_and(w[6], h1, bits);
      w[7] = ops::or_and(w[7], shift16<-2>(h1), bits);
    }
  }
}

// How far ahead of the quants being unpacked the kernel prefetches (a tile is one contiguous stream).
constexpr int64_t kPrefetchBytes = 4096;

// A K format group's fp16 super-block scales (d, and dmin where there are mins); zero otherwise.
template <int KIND>
static inline void group_scales(const uint8_t* sp, F& d, F& dmin) {
  d = ops::zero_f();
  dmin = ops::zero_f();
  if constexpr (KIND == Q4_K || KIND == Q5_K || KIND == Q6_K) d = ops::load_f16(sp + 256);
  if constexpr (KIND == Q4_K || KIND == Q5_K) dmin = ops::load_f16(sp + 288);
}

// Sub-block s's per-column scales: sa (and sb for Q6_K's second 16 values) and the min
// (as stored: Q4_K/Q5_K's is subtracted, Q4_1/Q5_1's added).
struct SubScales { F sa, sb, mn; };

template <int KIND>
static inline SubScales sub_scales(const uint8_t* sp, F d, F dmin, int s) {
  SubScales sc{ops::zero_f(), ops::zero_f(), ops::zero_f()};
  if constexpr (KIND == Q6_K) {
    sc.sa = ops::mul(d, ops::load_s8f(sp + 32 * s));
    sc.sb = ops::mul(d, ops::load_s8f(sp + 32 * s + 16));
  } else if constexpr (KIND == Q4_K || KIND == Q5_K) {
    sc.sa = ops::mul(d, ops::load_u8f(sp + 16 * s));
    sc.mn = ops::mul(dmin, ops::load_u8f(sp + 128 + 16 * s));
  } else {
    sc.sa = ops::load_f16(sp);
    if constexpr (KIND == Q4_1 || KIND == Q5_1) sc.mn = ops::load_f16(sp + 32);
  }
  return sc;
}

// acc + the column sums of quant groups [g0, g0 + n) of a sub-block against the row's 4n values x
// (exact integers). Where the product instruction only widens to 16 bits (AVX2), the variant sums
// as many products in 16 bits as max_quant(KIND) allows without overflow before widening.
template <int KIND>
static inline I dots(I acc, const ops::W<KIND == Q8_0>& wq, int g0, int n, const int8_t* x) {
  if constexpr (ops::kSums16) {
    return ops::dots16<max_quant(KIND)>(acc, wq, g0, n, x);
  } else if constexpr (ops::kProductChains == 2) {
    // Two chains of products, added at the end: the sums are exact integers, so their order changes
    // no bit, and a row's products do not wait one on another (AVX-512, one chain of 8 vpdpbusd a
    // Q4_K sub-block: 8 and 16 rows at 5.1-5.2 cycles a row in L2; two: 4.3-4.4, docs/benchmarks.md 39).
    I other = ops::zero_i();
    for (int g = g0; g < g0 + n; g += 2) {
      acc = ops::dot(acc, wq, g, x + 4 * (g - g0));
      if (g + 1 < g0 + n) other = ops::dot(other, wq, g + 1, x + 4 * (g + 1 - g0));
    }
    return ops::add_i(acc, other);
  } else {
    for (int g = g0; g < g0 + n; ++g) acc = ops::dot(acc, wq, g, x + 4 * (g - g0));
    return acc;
  }
}

// One row's step of one sub-block: acc += the sub-block's products, as in the header.
template <int KIND>
static inline F row_step(const ops::W<KIND == Q8_0>& wq, const SubScales& sc, const Rows& a, const int32_t* off,
                         bool has_off, int64_t rr, int64_t kb, F acc) {
  const int8_t* x = a.xq + rr * a.n_in + kb * 32;
  const int64_t ib = rr * a.nb32 + kb;
  if constexpr (KIND == Q6_K) {
    I i0 = ops::bcast_i32(a.off32h + 2 * ib);
    I i1 = ops::bcast_i32(a.off32h + 2 * ib + 1);
    i0 = dots<KIND>(i0, wq, 0, 4, x);
    i1 = dots<KIND>(i1, wq, 4, 4, x + 16);
    const F t = ops::fma(ops::cvt(i1), sc.sb, ops::mul(ops::cvt(i0), sc.sa));
    return ops::fma(t, ops::bcast_f(a.dx[ib]), acc);
  } else {
    constexpr bool kMin = KIND == Q4_1 || KIND == Q5_1 || KIND == Q4_K || KIND == Q5_K;
    I i0 = has_off ? ops::bcast_i32(off + ib) : ops::zero_i();
    i0 = dots<KIND>(i0, wq, 0, 8, x);
    const F t = ops::mul(ops::cvt(i0), ops::bcast_f(a.dx[ib]));
    F f = ops::fma(t, sc.sa, acc);
    if constexpr (KIND == Q4_K || KIND == Q5_K) f = ops::fnma(sc.mn, ops::bcast_f(a.xsum[ib]), f);
    else if constexpr (kMin) f = ops::fma(sc.mn, ops::bcast_f(a.xsum[ib]), f);
    return f;
  }
}

template <int KIND>
static inline const int32_t* row_offsets(const Rows& a) {
  return KIND == Q4_0 ? a.off8 : KIND == Q5_0 ? a.off16 : KIND == Q8_0 ? a.offq8 : nullptr;
}

// Walk one tile's sub-blocks in order: unpack each once and hand its quants, scales and global
// 32-block index to `rows`, which runs the activation rows' steps over it. Shared: more than one
// row reads the quants (an instruction set short of registers may keep some of them in L1 for that).
template <int KIND, bool Shared, class RowsFn>
static inline __attribute__((always_inline)) void each_sub_block(const uint8_t* tile, int64_t groups, RowsFn&& rows) {
  constexpr Layout L = layout(KIND);
  for (int64_t grp = 0; grp < groups; ++grp) {
    const uint8_t* gp = tile + grp * L.group_bytes;
    const uint8_t* sp = gp + L.subs * L.sub_bytes;  // the group's scales
    F d, dmin;
    group_scales<KIND>(sp, d, dmin);
    for (int s = 0; s < L.subs; ++s) {
      // The hardware prefetcher alone let one core stream about half of what oneDNN's kernel reads.
      const uint8_t* ahead = gp + s * L.sub_bytes + kPrefetchBytes;
      for (int line = 0; line < L.sub_bytes; line += 64) ops::prefetch(ahead + line);
      I w[8];
      unpack<KIND>(gp + s * L.sub_bytes, w);
      rows(ops::prepare<KIND == Q8_0, Shared>(w), sub_scales<KIND>(sp, d, dmin, s), grp * L.subs + s);
    }
  }
}

// One tile of 16 columns for rows [r0, r0 + nr): acc[r][c] (in memory) accumulates as in the header.
template <int KIND>
static void tile_rows(const uint8_t* tile, int64_t groups, const Rows& a, int64_t r0, int64_t nr, float* acc) {
  const int32_t* off = row_offsets<KIND>(a);
  const bool has_off = off != nullptr && (KIND != Q8_0 || ops::kQ8Zero != 0);
  each_sub_block<KIND, true>(tile, groups, [&](const auto& wq, const SubScales& sc, int64_t kb) {
    for (int64_t r = 0; r < nr; ++r)
      ops::store_f(acc + 16 * r, row_step<KIND>(wq, sc, a, off, has_off, r0 + r, kb, ops::load_f(acc + 16 * r)));
  });
}

// The same for exactly NR rows with their accumulators in registers for the whole tile (the
// same operations in the same order, so the same bits): a row then costs its products and
// scaling, not also a load and a store of its 16 sums per sub-block. The rows' loop is unrolled
// by request: left to itself GCC 12 kept Q6_K's, Q5_0's and Q8_0's 8 sums in memory (a load
// and a store a row and sub-block), which cost Q6_K 8 and 16 rows about 10% on AVX-512 (docs/benchmarks.md 41).
template <int KIND, int NR>
static void tile_rows_held(const uint8_t* tile, int64_t groups, const Rows& a, int64_t r0, float* acc_out) {
  const int32_t* off = row_offsets<KIND>(a);
  const bool has_off = off != nullptr && (KIND != Q8_0 || ops::kQ8Zero != 0);
  F acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = ops::load_f(acc_out + 16 * r);
  each_sub_block<KIND, (NR > 1)>(tile, groups, [&](const auto& wq, const SubScales& sc, int64_t kb) {
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) acc[r] = row_step<KIND>(wq, sc, a, off, has_off, r0 + r, kb, acc[r]);
  });
  for (int r = 0; r < NR; ++r) ops::store_f(acc_out + 16 * r, acc[r]);
}

// Rows [r0, r0 + nr) of one tile, in register-held runs of up to ops::kHeldRows rows where the
// instruction set has the registers for them (each run unpacks the tile again, from L1). A lone row
// (every plain decode step) always holds its sums in registers and its quants unshared: on AVX2
// that cut the 1-row Q4_K loop in L2 from about 47-50 to 26-35 cycles a sub-block (docs/benchmarks.md 15b).
// Two rows (a 1-token verification) hold theirs too: on AVX2 34-39 cycles a Q4_K sub-block against
// 44-45 with the sums in memory (16g); from three rows on, one run over the tile is cheaper there.
template <int KIND>
static void tile_rows_any(const uint8_t* tile, int64_t groups, const Rows& a, int64_t r0, int64_t nr, float* acc) {
  if (nr == 1) return tile_rows_held<KIND, 1>(tile, groups, a, r0, acc);
  if (nr == 2) return tile_rows_held<KIND, 2>(tile, groups, a, r0, acc);
  if constexpr (ops::kHeldRows > 0) {
    for (int64_t r = 0; r < nr;) {
      const int64_t n = std::min<int64_t>(ops::kHeldRows, nr - r);
      float* out = acc + 16 * r;
      switch (n) {
        case 1: tile_rows_held<KIND, 1>(tile, groups, a, r0 + r, out); break;
        case 2: tile_rows_held<KIND, std::min(2, ops::kHeldRows)>(tile, groups, a, r0 + r, out); break;
        case 3: tile_rows_held<KIND, std::min(3, ops::kHeldRows)>(tile, groups, a, r0 + r, out); break;
        case 4: tile_rows_held<KIND, std::min(4, ops::kHeldRows)>(tile, groups, a, r0 + r, out); break;
        case 5: tile_rows_held<KIND, std::min(5, ops::kHeldRows)>(tile, groups, a, r0 + r, out); break;
        case 6: tile_rows_held<KIND, std::min(6, ops::kHeldRows)>(tile, groups, a, r0 + r, out); break;
        case 7: tile_rows_held<KIND, std::min(7, ops::kHeldRows)>(tile, groups, a, r0 + r, out); break;
        default: tile_rows_held<KIND, std::min(8, ops::kHeldRows)>(tile, groups, a, r0 + r, out); break;
      }
      r += n;
    }
  } else {
    tile_rows<KIND>(tile, groups, a, r0, nr, acc);
  }
}

constexpr int64_t kRowChunk = 64;

// Columns [0, n_cols) of one tile for all R rows, written into y (row stride ldy) with bias.
template <int KIND>
static void run_tile(const uint8_t* tile, int64_t groups, const Rows& a, int64_t R, int64_t n_cols,
                     const float* bias, void* y, bool bf16_out, int64_t ldy) {
  alignas(64) float acc[kRowChunk * 16];
  for (int64_t r0 = 0; r0 < R; r0 += kRowChunk) {
    const int64_t nr = std::min<int64_t>(kRowChunk, R - r0);
    for (int64_t i = 0; i < nr * 16; ++i) acc[i] = 0.0f;
    tile_rows_any<KIND>(tile, groups, a, r0, nr, acc);
    for (int64_t r = 0; r < nr; ++r) {
      F v = ops::load_f(acc + 16 * r);
      if (bias != nullptr) v = ops::add(v, ops::load_partial_f(bias, n_cols));
      if (bf16_out) ops::store_bf16(static_cast<uint16_t*>(y) + (r0 + r) * ldy, v, n_cols);
      else ops::store_partial_f(static_cast<float*>(y) + (r0 + r) * ldy, v, n_cols);
    }
  }
}

using TileFn = void (*)(const uint8_t*, int64_t, const Rows&, int64_t, int64_t, const float*, void*, bool, int64_t);

static TileFn tile_fn(int kind) {
  switch (kind) {
    case Q4_0: return run_tile<Q4_0>;
    case Q4_1: return run_tile<Q4_1>;
    case Q5_0: return run_tile<Q5_0>;
    case Q5_1: return run_tile<Q5_1>;
    case Q8_0: return run_tile<Q8_0>;
    case Q4_K: return run_tile<Q4_K>;
    case Q5_K: return run_tile<Q5_K>;
    case Q6_K: return run_tile<Q6_K>;
  }
  return nullptr;
}

// y[R, n_out] (row stride ldy, fp32 or bf16) = x[R, n_in] @ W^T + bias, on its own (the `linear`
// entry point; the native layer runs matmul_share inside its one parallel region instead): the
// activation rows are quantized once, then threads share the weight bytes (TileQueue).
static void matmul(const float* x, int64_t R, const MatDesc& m, const float* bias, void* y, bool bf16_out, int64_t ldy) {
  static thread_local QuantBuffers q;
  static thread_local TileQueue caller_queue;
  TileQueue& queue = caller_queue;  // the caller's: a thread_local named inside the lambda would be each worker's own
  q.reserve(R, m.n_in);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t b = 0; b < m.n_in / 32; ++b) q.quantize(m.n_in, x + r * m.n_in + 32 * b, r, b);
  const Rows a = q.rows(m.n_in);
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(m.chunk_end.size())));
  queue.reset(m, nt);
  at::parallel_for(0, nt, 1, [&](int64_t begin, int64_t end) {
    for (int64_t th = begin; th < end; ++th) matmul_share(a, R, m, bias, y, bf16_out, ldy, tile_fn, th, queue);
  });
}

}  // namespace body
