#include <immintrin.h>
#include <x86intrin.h>
#include <cstdio>
#include <cstdint>
#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define DA(i) __m256i a##i=_mm256_set1_epi8(i+1);
#define SG(i) asm volatile("":"+x"(a##i));
#define SU(i) s+=_mm256_extract_epi32(a##i,0);
#define TEST(name, OP) __attribute__((target("avx2,fma"),noinline)) double name(long N){ __m256i b=_mm256_set1_epi8(3); R8(DA) uint64_t t0=__rdtsc(); for(long n=0;n<N;n++){ R8(OP) R8(SG) } uint64_t t1=__rdtsc(); int s=0; R8(SU) if(s==7) printf("x"); return (t1-t0)/(8.0*N);}
#define MU(i) a##i=_mm256_maddubs_epi16(a##i,b);
#define MD(i) a##i=_mm256_madd_epi16(a##i,b);
#define AD(i) a##i=_mm256_add_epi16(a##i,b);
#define ML(i) a##i=_mm256_mullo_epi16(a##i,b);
#define CV(i) a##i=_mm256_castps_si256(_mm256_fmadd_ps(_mm256_castsi256_ps(a##i),_mm256_castsi256_ps(b),_mm256_castsi256_ps(b)));
#define MIX(i) a##i=(i&1)?_mm256_maddubs_epi16(a##i,b):_mm256_castps_si256(_mm256_fmadd_ps(_mm256_castsi256_ps(a##i),_mm256_castsi256_ps(b),_mm256_castsi256_ps(b)));
#define MIX2(i) a##i=(i&1)?_mm256_maddubs_epi16(a##i,b):_mm256_madd_epi16(a##i,b);
TEST(tmu,MU) TEST(tmd,MD) TEST(tad,AD) TEST(tml,ML) TEST(tfm,CV) TEST(tmix,MIX) TEST(tmix2,MIX2)
int main(){ long N=50000000; for(int t=0;t<2;t++) printf("tsc/op maddubs %.3f madd %.3f add16 %.3f mullo %.3f fma %.3f maddubs|fma %.3f maddubs|madd %.3f\n",tmu(N),tmd(N),tad(N),tml(N),tfm(N),tmix(N),tmix2(N)); }
