#include <immintrin.h>
#include <x86intrin.h>
#include <cstdio>
#include <cstdint>
#include <vector>
// 16 accumulators: (a) 8 zmm loads + 16 adds a key; (b) 16 adds of registers only (no loads); (c) 8 loads only (summed into 8)
template<int MODE> __attribute__((target("avx512f"))) void run(const float* v, int n, int reps){
  __m512 acc[16]; for(int i=0;i<16;++i) acc[i]=_mm512_set1_ps(i);
  __m512 x0=_mm512_set1_ps(1e-7f);
  uint64_t t0=__rdtsc();
  for(int r=0;r<reps;++r) for(int j=0;j<n;++j){ const float* vj=v+j*128;
    if (MODE==0) for(int c=0;c<8;++c){ __m512 x=_mm512_loadu_ps(vj+16*c); acc[2*c]=_mm512_add_ps(acc[2*c],x); acc[2*c+1]=_mm512_add_ps(acc[2*c+1],x); }
    else if (MODE==1) { for(int c=0;c<16;++c) acc[c]=_mm512_add_ps(acc[c],x0); asm volatile("" : "+v"(x0)); }
    else for(int c=0;c<8;++c){ __m512 x=_mm512_loadu_ps(vj+16*c); acc[c]=_mm512_add_ps(acc[c],x); }
  }
  uint64_t t=__rdtsc()-t0; float s=0; for(int i=0;i<16;++i){ float b[16]; _mm512_storeu_ps(b,acc[i]); s+=b[0]; }
  printf("mode %d: TSC per key %.2f %g\n", MODE, (double)t/((double)reps*n), s);
}
int main(){ std::vector<float> v(32*128, 1.0f); for(int k=0;k<2;++k){ run<0>(v.data(),32,200000); run<1>(v.data(),32,200000); run<2>(v.data(),32,200000);} }
