#include <immintrin.h>
#include <x86intrin.h>
#include <cstdio>
#include <cstdint>
// throughput of independent zmm / ymm multiplies (16 chains), registers only
template<int W> __attribute__((target("avx512f"))) void run(long reps){
  if (W==16){ __m512 a[16]; for(int i=0;i<16;++i) a[i]=_mm512_set1_ps(1.0f+i*1e-9f); __m512 m=_mm512_set1_ps(1.0000001f);
    uint64_t t0=__rdtsc(); for(long r=0;r<reps;++r){ for(int i=0;i<16;++i) a[i]=_mm512_mul_ps(a[i],m); asm volatile("" : "+v"(m)); }
    uint64_t t=__rdtsc()-t0; float s=0; for(int i=0;i<16;++i){float b[16]; _mm512_storeu_ps(b,a[i]); s+=b[0];} printf("zmm mul: %.3f TSC each %g\n",(double)t/(16.0*reps),s);}
  else { __m256 a[16]; for(int i=0;i<16;++i) a[i]=_mm256_set1_ps(1.0f+i*1e-9f); __m256 m=_mm256_set1_ps(1.0000001f);
    uint64_t t0=__rdtsc(); for(long r=0;r<reps;++r){ for(int i=0;i<16;++i) a[i]=_mm256_mul_ps(a[i],m); asm volatile("" : "+v"(m)); }
    uint64_t t=__rdtsc()-t0; float s=0; for(int i=0;i<16;++i){float b[8]; _mm256_storeu_ps(b,a[i]); s+=b[0];} printf("ymm mul: %.3f TSC each %g\n",(double)t/(16.0*reps),s);}
}
int main(){ run<16>(20000000); run<8>(20000000); run<16>(20000000); run<8>(20000000);}
