#include <immintrin.h>
#include <x86intrin.h>
#include <cstdio>
#include <cstdint>
#include <vector>
template<int MODE> __attribute__((target("avx512f,fma"))) void run(const float* v, int n, int reps){
  __m512 acc[16]; for(int i=0;i<16;++i) acc[i]=_mm512_setzero_ps();
  __m512 p0=_mm512_set1_ps(0.5f), p1=_mm512_set1_ps(0.25f);
  uint64_t t0=__rdtsc();
  for(int r=0;r<reps;++r) for(int j=0;j<n;++j){ const float* vj=v+j*128;
    for(int c=0;c<8;++c){ __m512 x=_mm512_loadu_ps(vj+16*c);
      if (MODE==0){ acc[2*c]=_mm512_add_ps(acc[2*c],_mm512_mul_ps(p0,x)); acc[2*c+1]=_mm512_add_ps(acc[2*c+1],_mm512_mul_ps(p1,x)); }
      else if (MODE==1){ acc[2*c]=_mm512_fmadd_ps(p0,x,acc[2*c]); acc[2*c+1]=_mm512_fmadd_ps(p1,x,acc[2*c+1]); }
      else { acc[2*c]=_mm512_add_ps(acc[2*c],x); acc[2*c+1]=_mm512_add_ps(acc[2*c+1],x); }
    }}
  uint64_t t=__rdtsc()-t0; float s=0; for(int i=0;i<16;++i){ float b[16]; _mm512_storeu_ps(b,acc[i]); s+=b[0]; }
  printf("mode %d zmm: TSC per key %.2f %g\n", MODE, (double)t/((double)reps*n), s);
}
template<int MODE> __attribute__((target("avx2,fma"))) void run8(const float* v, int n, int reps){
  __m256 acc[16]; for(int i=0;i<16;++i) acc[i]=_mm256_setzero_ps();
  __m256 p0=_mm256_set1_ps(0.5f);
  uint64_t t0=__rdtsc();
  for(int r=0;r<reps;++r) for(int j=0;j<n;++j){ const float* vj=v+j*128;
    for(int c=0;c<16;++c){ __m256 x=_mm256_loadu_ps(vj+8*c);
      if (MODE==0) acc[c]=_mm256_add_ps(acc[c],_mm256_mul_ps(p0,x)); else acc[c]=_mm256_fmadd_ps(p0,x,acc[c]); }}
  uint64_t t=__rdtsc()-t0; float s=0; for(int i=0;i<16;++i){ float b[8]; _mm256_storeu_ps(b,acc[i]); s+=b[0]; }
  printf("mode %d ymm (16 mul+add of 8 lanes = one head's key): TSC per key %.2f %g\n", MODE, (double)t/((double)reps*n), s);
}
int main(){ std::vector<float> v(32*128, 1.0f); for(int k=0;k<2;++k){ run<0>(v.data(),32,200000); run<1>(v.data(),32,200000); run<2>(v.data(),32,200000); run8<0>(v.data(),32,200000); run8<1>(v.data(),32,200000);} }
