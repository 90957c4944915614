/* IEEE binary16 (f16) and bfloat16 (bf16) <-> binary32 conversions, bit-exact:
 * subnormals, signed zeros, infinities and NaNs keep their meaning; f32 -> f16/bf16
 * rounds to nearest, ties to even, and overflows to infinity. NaNs stay NaN (quiet
 * bit set, upper payload bits kept). Pure integer code: no dependence on the FPU's
 * rounding mode or on F16C. */
#ifndef LLMOPT_BASE_FP16_H
#define LLMOPT_BASE_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fp16_f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static inline float fp16_bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static inline float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* inf / nan: payload moves to the top of the f32 mantissa */
        return fp16_bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) /* normal: rebias exponent 15 -> 127 */
        return fp16_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0)
        return fp16_bits_f32(sign);
    /* subnormal mant * 2^-24: normalize; f32 exponent 113 is 2^-14 */
    uint32_t e = 113;
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    return fp16_bits_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

static inline uint16_t fp16_from_f32(float f) {
    uint32_t x = fp16_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u)
            return sign | 0x7c00u;
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* quiet nan */
    }
    if (ax >= 0x477ff000u) /* >= 65520 = halfway between 65504 and 2^16: ties to inf */
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) { /* >= 2^-14: normal f16 */
        uint32_t odd = (ax >> 13) & 1u;
        /* rebias exponent 127 -> 15, then round the 13 dropped bits; a carry out of
         * the mantissa correctly bumps the exponent */
        return (uint16_t)(sign | ((ax - 0x38000000u + 0xfffu + odd) >> 13));
    }
    if (ax <= 0x33000000u) /* <= 2^-25: half of the smallest subnormal, ties to 0 */
        return sign;
    /* subnormal: value = m * 2^(e-150); result = round(m * 2^(e-126)) units of 2^-24 */
    uint32_t e = ax >> 23; /* 102..112 */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u)))
        r++; /* may reach 0x400, the smallest normal: still the right encoding */
    return (uint16_t)(sign | r);
}

static inline float bf16_to_f32(uint16_t h) {
    return fp16_bits_f32((uint32_t)h << 16);
}

static inline uint16_t bf16_from_f32(float f) {
    uint32_t x = fp16_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet nan; truncation could make it inf */
    /* round to nearest even on the 16 dropped bits; overflow carries into inf */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif
