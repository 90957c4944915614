/* Prefetch lab: the AVX-512 Q8_0 pair kernel (one row, 4 columns per tile) streaming
 * ~800 MB of weights from memory (or, with an argument, 192 columns resident in L2)
 * with different software prefetches (distance in tiles, L1 / L2 hint), one thread,
 * best of 7 of thread CPU time.
 *
 *   bench/ab/run.sh prefetch [hot]                                       */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#include "backend/cpu/kernels.h"
#include "format/quant.h"
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+t.tv_nsec*1e-9;}
#define K 1024
#define N 1024
#define AI static inline __attribute__((always_inline))
/* zmm pair kernel (as the new tile, 1 row, C cols), prefetch variants: distance D1 tiles hint H1, optional D2 with T1/T2 */
AI void z_grp(const struct cpu_qact *qa, const uint8_t *w, size_t ldw, float *y, const int C, const int D1, const int H1, const int D2, const int H2){
  const int nb=K/32; const __m512i flip=_mm512_set1_epi8((char)0x80);
  const __m512i off=_mm512_mullo_epi32(_mm512_setr_epi32(0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15),_mm512_set1_epi32(34));
  __m512 acc[8]; for(int c=0;c<C;c++) acc[c]=_mm512_setzero_ps();
  for(int b0=0;b0<nb;b0+=16){ __m512 tbl[8]; __m512 dx=_mm512_loadu_ps(qa->d+b0);
    for(int c=0;c<C;c++){ __m512i h=_mm512_i32gather_epi32(off,w+c*ldw+b0*34,1); tbl[c]=_mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)),dx);}
#pragma GCC unroll 8
    for(int p=0;p<8;p++){ int b=b0+2*p; __m512i xq=_mm512_loadu_si512((const void*)(qa->qs+b*32)); __m512i cr=_mm512_loadu_si512((const void*)(qa->corr+b*8));
      __m512i idx=_mm512_setr_epi32(2*p,2*p,2*p,2*p,2*p,2*p,2*p,2*p,2*p+1,2*p+1,2*p+1,2*p+1,2*p+1,2*p+1,2*p+1,2*p+1);
#pragma GCC unroll 8
      for(int c=0;c<C;c++){ const uint8_t*blk=w+c*ldw+b*34;
        if(D1){ const char*a=(const char*)blk+D1*C*ldw; if(H1==0){_mm_prefetch(a,_MM_HINT_T0);_mm_prefetch(a+67,_MM_HINT_T0);} else if(H1==1){_mm_prefetch(a,_MM_HINT_T1);_mm_prefetch(a+67,_MM_HINT_T1);} else {_mm_prefetch(a,_MM_HINT_T2);_mm_prefetch(a+67,_MM_HINT_T2);} }
        if(D2){ const char*a=(const char*)blk+D2*C*ldw; if(H2==1){_mm_prefetch(a,_MM_HINT_T1);_mm_prefetch(a+67,_MM_HINT_T1);} else if(H2==3){_mm_prefetch(a+67,_MM_HINT_T1);} else {_mm_prefetch(a,_MM_HINT_T2);_mm_prefetch(a+67,_MM_HINT_T2);} }
        __m512i wv=_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const void*)(blk+2))),_mm256_loadu_si256((const void*)(blk+36)),1);
        __m512i s=_mm512_dpbusd_epi32(cr,_mm512_xor_si512(wv,flip),xq);
        acc[c]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),_mm512_permutexvar_ps(idx,tbl[c]),acc[c]); } } }
  for(int c=0;c<C;c++) y[c]=_mm512_reduce_add_ps(acc[c]); }
typedef void (*rowfn)(const struct cpu_qact *qa, const uint8_t *w, size_t ldw, int n, float *y);
#define V(name,C,D1,H1,D2,H2) static void name(const struct cpu_qact *qa, const uint8_t *w, size_t ldw, int n, float *y){ for(int c=0;c<n;c+=C) z_grp(qa,w+c*ldw,ldw,y+c,C,D1,H1,D2,H2);}
V(v_t0_1,4,1,0,0,0) V(v_t0_1_t1_4,4,1,0,4,1) V(v_t0_1_t1_4h,4,1,0,4,3)
int main(int argc,char**argv){
  const struct cpu_isa_kernels *kern=cpu_isa_kernels_get(CPU_ISA_AVX512);
  size_t ldw=ir_dtype_row_bytes(IR_DTYPE_Q8_0,K), bytes=ldw*N; int hot=argc>1; int copies=hot?1:(int)((800u<<20)/bytes)+1;
  uint8_t **w=malloc(copies*sizeof*w); float *tmp=malloc(K*4); w[0]=aligned_alloc(64,bytes+64);
  for(int j=0;j<N;j++){ for(int i=0;i<K;i++) tmp[i]=(float)((rand()%2001)-1000)/1000.f; quant_quantize_row_q8_0(tmp,w[0]+j*ldw,K);} 
  for(int c=1;c<copies;c++){ w[c]=aligned_alloc(64,bytes+64); memcpy(w[c],w[0],bytes);}
  float *x=malloc(K*4); for(int i=0;i<K;i++) x[i]=(float)((rand()%2001)-1000)/1000.f;
  void*buf=aligned_alloc(64,cpu_qact_bytes(1,K)+64); struct cpu_qact qa; cpu_qact_bind(&qa,buf,1,K); kern->quantize_row(x,&qa,0);
  rowfn fns[]={v_t0_1,v_t0_1_t1_4,v_t0_1_t1_4h}; const char*names[]={"T0 +1 tile","T0+1 & T1+4 (2/pair)","T0+1 & T1+4 (1/pair)"};
  int nf=sizeof fns/sizeof*fns; double best[16]; for(int f=0;f<nf;f++) best[f]=1e9; float *y=malloc(N*4);
  for(int rep=0;rep<7;rep++) for(int f=0;f<nf;f++){ double t0=now(); for(int it=0;it<(hot?100:1);it++) for(int c=0;c<copies;c++) fns[f](&qa,w[c],ldw,hot?192:N,y); double t=now()-t0; if(t<best[f])best[f]=t; }
  for(int f=0;f<nf;f++) printf("%-24s %.1f GB/s\n",names[f],(double)(hot?ldw*192*100:bytes*copies)/best[f]/1e9);
}
