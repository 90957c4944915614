/* The scalar arithmetic of the IR's elementwise ops, written once for every backend: the
 * CPU reference (cpu/ref_ops.c), the CPU kernels' fused epilogues (cpu/kernels.c) and the
 * CUDA kernels (cuda/cuda_device.cuh, where nvcc compiles these as device functions).
 * Plain f32 expressions in a fixed order, without fast-math, so every backend rounds the
 * same way and the reference stays the oracle.
 *
 * `op` is an enum ir_op value (an int, so CUDA code can pass the epilogue's plain int).
 * Callers pass only the ops of their kind (ir_op_is_unary_elementwise /
 * ir_op_is_binary_elementwise, which the graph checks in ir/ir.c also hold a fused
 * linear's activation to). An op outside the list
 * leaves x unchanged (op_unary_apply: IR_OP_INPUT is "no activation") or gives 0
 * (op_binary_apply). */
#ifndef LLMOPT_BACKEND_OP_MATH_H
#define LLMOPT_BACKEND_OP_MATH_H

#include "ir/ir.h"

#include <math.h>

#ifdef __CUDACC__
#define OP_MATH_FN static __host__ __device__ __forceinline__
#else
#define OP_MATH_FN static inline
#endif

OP_MATH_FN float op_unary_apply(int op, float x) {
    switch (op) {
    case IR_OP_NEG: return -x;
    case IR_OP_EXP: return expf(x);
    case IR_OP_SQRT: return sqrtf(x);
    case IR_OP_RSQRT: return 1.0f / sqrtf(x);
    case IR_OP_RECIP: return 1.0f / x;
    case IR_OP_SILU: return x / (1.0f + expf(-x));
    case IR_OP_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case IR_OP_TANH: return tanhf(x);
    case IR_OP_RELU: return x > 0 ? x : 0;
    case IR_OP_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case IR_OP_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case IR_OP_COS: return cosf(x);
    case IR_OP_SIN: return sinf(x);
    default: return x; /* IR_OP_INPUT (or -1 in CUDA epilogues): no activation */
    }
}

OP_MATH_FN float op_binary_apply(int op, float a, float b) {
    switch (op) {
    case IR_OP_ADD: return a + b;
    case IR_OP_SUB: return a - b;
    case IR_OP_MUL: return a * b;
    case IR_OP_DIV: return a / b;
    case IR_OP_POW: return b == 2.0f ? a * a : powf(a, b);
    case IR_OP_MAXIMUM: return a > b ? a : b;
    case IR_OP_MINIMUM: return a < b ? a : b;
    default: return 0.0f;
    }
}

#endif
