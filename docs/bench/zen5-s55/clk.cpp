#include <x86intrin.h>
#include <cstdio>
#include <cstdint>
int main(){ uint64_t x=1; uint64_t n=400000000; uint64_t t0=__rdtsc();
 for(uint64_t i=0;i<n;++i){ asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x)); }
 uint64_t t=__rdtsc()-t0; printf("TSC cycles per dependent add: %.3f (core/TSC ratio %.2f)\n", (double)t/(4.0*n), 4.0*n/(double)t); }
