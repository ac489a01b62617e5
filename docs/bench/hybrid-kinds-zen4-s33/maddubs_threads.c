#include <immintrin.h>
#include <stdio.h>
#include <omp.h>
int main(){
  long N=1000000000L; double t0=omp_get_wtime(); long total=0;
  #pragma omp parallel reduction(+:total)
  { __m256i w[8]; for(int i=0;i<8;i++) w[i]=_mm256_set1_epi8(i+1);
    __m256i x=_mm256_set1_epi8(3);
    __m256i a[8]; for(int i=0;i<8;i++) a[i]=_mm256_setzero_si256();
    long M=N/omp_get_num_threads();
    for(long n=0;n<M;n++){
      __asm__ volatile("":"+x"(x));
      #pragma GCC unroll 8
      for(int i=0;i<8;i++) a[i]=_mm256_add_epi16(a[i],_mm256_maddubs_epi16(w[i],x));
    }
    __m256i s=a[0]; for(int i=1;i<8;i++) s=_mm256_add_epi16(s,a[i]);
    total+=_mm256_extract_epi16(s,0);
  }
  double t=omp_get_wtime()-t0;
  printf("threads %d: %.3f s, %.2f G maddubs/s total\n", omp_get_max_threads(), t, 8.0*N/t/1e9);
  return (int)(total&1);
}
