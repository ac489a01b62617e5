// Prototype timing (not part of augury): cycles per Q4_K-like sub-block (16 columns x 32 values) for nr
// activation rows, (a) VNNI: 8 vpdpbusd per row plus the row's scaling, (b) AMX: unpacked quants stored
// once, one tdpbsud for all rows, the rows' scaling from the stored int32 sums. Data stays in L1.
#include <immintrin.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

struct alignas(64) Cfg { uint8_t palette, start; uint8_t r0[14]; uint16_t colsb[16]; uint8_t rows[16]; };

__attribute__((target("avx512f,avx512bw,avx512vnni")))
static float run_vnni(const uint8_t* packed, const int8_t* xq, const float* dxs, const float* xss, int nr, int subs, int reps) {
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512 sa = _mm512_set1_ps(0.01f), mn = _mm512_set1_ps(0.02f);
  for (int rep = 0; rep < reps; ++rep)
    for (int s = 0; s < subs; ++s) {
      const uint8_t* p = packed + 256 * (s & 63);
      __m512i w[8];
      for (int i = 0; i < 4; ++i) {
        __m512i v = _mm512_loadu_si512(p + 64 * i);
        w[i] = _mm512_and_si512(v, nib);
        w[i + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      }
      for (int r = 0; r < nr; ++r) {
        const int8_t* x = xq + r * 4096 + 32 * (s & 63);
        __m512i i0 = _mm512_setzero_si512();
        for (int g = 0; g < 8; ++g) {
          int32_t xv; std::memcpy(&xv, x + 4 * g, 4);
          i0 = _mm512_dpbusd_epi32(i0, w[g], _mm512_set1_epi32(xv));
        }
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(i0), _mm512_set1_ps(dxs[r * 64 + (s & 63)]));
        __m512 f = _mm512_fmadd_ps(t, sa, acc[r]);
        acc[r] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(xss[r * 64 + (s & 63)]), f);
      }
    }
  float out = 0;
  for (int r = 0; r < nr; ++r) out += _mm512_reduce_add_ps(acc[r]);
  return out;
}

__attribute__((target("avx512f,avx512bw,amx-tile,amx-int8")))
static float run_amx(const uint8_t* packed, const int8_t* xq, const float* dxs, const float* xss, int nr, int subs, int reps) {
  Cfg cfg{}; cfg.palette = 1;
  cfg.rows[0] = nr; cfg.colsb[0] = 64;   // C: nr x 16 int32
  cfg.rows[1] = nr; cfg.colsb[1] = 32;   // A: nr x 32 s8
  cfg.rows[2] = 8; cfg.colsb[2] = 64;    // B: 8 x (16 x 4) u8
  cfg.rows[3] = nr; cfg.colsb[3] = 64;
  cfg.rows[4] = nr; cfg.colsb[4] = 32;
  cfg.rows[5] = 8; cfg.colsb[5] = 64;
  _tile_loadconfig(&cfg);
  alignas(64) uint8_t bbuf[2][512];
  alignas(64) int32_t cbuf[2][16 * 16];
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512 sa = _mm512_set1_ps(0.01f), mn = _mm512_set1_ps(0.02f);
  for (int rep = 0; rep < reps; ++rep)
    for (int s = 0; s < subs; s += 2) {
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = packed + 256 * ((s + h) & 63);
        for (int i = 0; i < 4; ++i) {
          __m512i v = _mm512_loadu_si512(p + 64 * i);
          _mm512_store_si512(bbuf[h] + 64 * i, _mm512_and_si512(v, nib));
          _mm512_store_si512(bbuf[h] + 64 * (i + 4), _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
        }
      }
      const int8_t* x0 = xq + 32 * (s & 63);
      _tile_zero(0); _tile_zero(3);
      _tile_loadd(1, x0, 4096); _tile_loadd(2, bbuf[0], 64);
      _tile_loadd(4, x0 + 32, 4096); _tile_loadd(5, bbuf[1], 64);
      _tile_dpbsud(0, 1, 2);
      _tile_dpbsud(3, 4, 5);
      _tile_stored(0, cbuf[0], 64); _tile_stored(3, cbuf[1], 64);
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < nr; ++r) {
          const int8_t* x = x0 + r * 4096 + 32 * h;
          __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf[h] + 16 * r)), _mm512_set1_ps(dxs[r * 64 + (s & 63)]));
          __m512 f = _mm512_fmadd_ps(t, sa, acc[r]);
          acc[r] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(xss[r * 64 + (s & 63)]), f);
        }
    }
  _tile_release();
  float out = 0;
  for (int r = 0; r < nr; ++r) out += _mm512_reduce_add_ps(acc[r]);
  return out;
}

int main() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  std::vector<uint8_t> packed(256 * 64);
  std::vector<int8_t> xq(16 * 4096);
  std::vector<float> dx(16 * 64, 0.001f), xs(16 * 64, 0.002f);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = (i * 37) & 0xFF;
  for (size_t i = 0; i < xq.size(); ++i) xq[i] = static_cast<int8_t>((i * 11) % 200 - 100);
  const int subs = 64, reps = 200000;
  for (int nr : {1, 2, 4, 5, 8, 16}) {
    double best[2] = {1e9, 1e9};
    float sink = 0;
    for (int t = 0; t < 3; ++t)
      for (int k = 0; k < 2; ++k) {
        auto a = std::chrono::steady_clock::now();
        sink += k == 0 ? run_vnni(packed.data(), xq.data(), dx.data(), xs.data(), nr, subs, reps) : run_amx(packed.data(), xq.data(), dx.data(), xs.data(), nr, subs, reps);
        double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - a).count() / (double(subs) * reps);
        if (ns < best[k]) best[k] = ns;
      }
    std::printf("rows %2d: vnni %.2f ns/sub-block (%.2f per row), amx %.2f ns (%.2f per row)  [%g]\n", nr, best[0],
                best[0] / nr, best[1], best[1] / nr, sink);
  }
}
