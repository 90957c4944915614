/* A/B of two AVX-512 kernel tables in one process: an older commit's isa_avx512.c
 * (compiled by run.sh with its table renamed cpu_isa_kernels_avx512_old) against this
 * tree's, both through this tree's cpu_linear_run on one thread, alternating, best of
 * several repeats of thread CPU time. Prints GB/s of weights for rows 1..32.
 *
 *   bench/ab/run.sh OLD_COMMIT [q8|q4|f16] [cold 0|1] [k] [n]
 * THREADS=N: through a pool of N threads, timed in wall-clock time. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "format/quant.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
extern const struct cpu_isa_kernels cpu_isa_kernels_avx512_old;
static int wall;
static double now(void){struct timespec t; clock_gettime(wall?CLOCK_MONOTONIC:CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+t.tv_nsec*1e-9;}
static float rnd(void){ return (float)((rand()%2001)-1000)/1000.f; }
int main(int argc,char**argv){
  enum ir_dtype t = argc>1 && !strcmp(argv[1],"q4")? IR_DTYPE_Q4_0 : argc>1 && !strcmp(argv[1],"f16")? IR_DTYPE_F16: IR_DTYPE_Q8_0;
  int cold = argc>2 && atoi(argv[2]); int K = argc>3? atoi(argv[3]):1024, N = argc>4? atoi(argv[4]): 256;
  const struct cpu_isa_kernels *kn=cpu_isa_kernels_get(CPU_ISA_AVX512), *ko=&cpu_isa_kernels_avx512_old;
  size_t ldw=ir_dtype_row_bytes(t,K), bytes=ldw*N; int copies = cold? (int)((700u<<20)/bytes)+1 : 1;
  uint8_t **w=malloc(copies*sizeof*w); float *tmp=malloc(K*4);
  w[0]=aligned_alloc(64,bytes+64);
  for(int j=0;j<N;j++){ for(int i=0;i<K;i++) tmp[i]=rnd(); uint8_t*d=w[0]+j*ldw;
    if(t==IR_DTYPE_Q8_0) quant_quantize_row_q8_0(tmp,d,K); else if(t==IR_DTYPE_Q4_0) quant_quantize_row_q4_0(tmp,d,K); else for(int i=0;i<K;i++){ _Float16 h=(_Float16)tmp[i]; memcpy(d+2*i,&h,2);} }
  for(int c=1;c<copies;c++){ w[c]=aligned_alloc(64,bytes+64); memcpy(w[c],w[0],bytes);}
  if(getenv("GMR")) cpu_gemm_min_rows=atoi(getenv("GMR"));
  struct cpu_pool *pool=NULL; struct llmopt_err perr;
  if(getenv("THREADS")){ wall=1; if(pool_create(atoi(getenv("THREADS")),&pool,&perr)) { fprintf(stderr,"%s\n",perr.msg); return 1; } }
  int rowsv[]={1,2,3,4,5,8,16,32};
  printf("%s %s k %d n %d: GB/s of weights (old -> new), best of reps\n", ir_dtype_name(t), cold?"cold":"hot(L2)",K,N);
  for(int ri=0;ri<8;ri++){ int rows=rowsv[ri];
    float *x=malloc((size_t)rows*K*4),*y=malloc((size_t)rows*N*4),*y2=malloc((size_t)rows*N*4); for(int i=0;i<rows*K;i++) x[i]=rnd();
    int nth=pool?pool_threads(pool):1; size_t sb=cpu_linear_scratch_bytes(kn,t,rows,K,nth); size_t sb2=cpu_linear_scratch_bytes(ko,t,rows,K,nth); void*sc=malloc((sb>sb2?sb:sb2)+64);
    struct cpu_linear op={.x=x,.rows=rows,.k=K,.n_out=N,.wtype=t,.act=IR_OP_INPUT,.y=y,.scratch=sc,.w=w[0]};
    cpu_linear_run(&op,ko,pool); op.y=y2; cpu_linear_run(&op,kn,pool); double md=0; for(int i=0;i<rows*N;i++){double d=y[i]-y2[i]; if(d<0)d=-d; if(d>md)md=d;}
    double best[2]={1e9,1e9}; int inner = cold?1:50;
    for(int rep=0;rep<(cold?5:15);rep++) for(int v=0;v<2;v++){ const struct cpu_isa_kernels*kk=v?kn:ko; double t0=now();
      for(int it=0;it<inner;it++) for(int c=0;c<copies;c++){ op.w=w[c]; cpu_linear_run(&op,kk,pool);} double dt=now()-t0; if(dt<best[v])best[v]=dt; }
    double gb=(double)bytes*copies*inner/1e9; printf("rows %2d: %6.1f -> %6.1f GB/s  (%.2fx)  maxdiff %.1e\n", rows, gb/best[0], gb/best[1], best[0]/best[1], md);
    free(x);free(y);free(y2);free(sc);}
}
