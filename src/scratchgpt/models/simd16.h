/* Sixteen fp32 lanes at a time (one AVX-512 register): masked loads and stores of fp32 or bf16
 * data (and a whole row's store), bf16 rounding, exp, and a 16 x 16 transpose of 32-bit
 * values. Included by causal_attention.c, tile_matmul.c, decode_step.c and block_ops.c
 * (c_kernels.py's build key covers included files). */
#ifndef SCRATCHGPT_SIMD16_H
#define SCRATCHGPT_SIMD16_H
#include <immintrin.h>
#include <stdint.h>

/* which of the 16 values from k on exist, when there are n in all */
static inline __mmask16 tail16(long k, long n) {
    return n - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - k)) - 1);
}

/* 16 values at p + k (those in mask m; 0 for the rest), fp32 or bf16, as fp32 */
static inline __m512 load16(const void *p, int bf16, long k, __mmask16 m) {
    if (!bf16) return _mm512_maskz_loadu_ps(m, (const float *)p + k);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 fp32 values rounded to bf16, to nearest even (NaN stays NaN), as torch's conversion does */
static inline __m256i round_bf16(__m512 x) {
#ifdef __AVX512BF16__
    /* One instruction rounds the same way, but reads denormal inputs as zero (and quiets NaN
     * its own way): vectors with any of those, rare, take the long way below. */
    if (!_mm512_fpclass_ps_mask(x, 0x01 | 0x20 | 0x80)) /* quiet NaN, denormal, signalling NaN */
        return (__m256i)_mm512_cvtneps_pbh(x);
#endif
    __m512i u = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* x (the lanes in mask m) stored at p + k as fp32 or bf16 */
static inline void store16(void *p, int bf16, long k, __mmask16 m, __m512 x) {
    if (bf16)
        _mm256_mask_storeu_epi16((uint16_t *)p + k, m, round_bf16(x));
    else
        _mm512_mask_storeu_ps((float *)p + k, m, x);
}

/* src[0 .. n) times mul, stored at p + i as fp32 or bf16 */
static inline void store_row(void *p, int bf16, long i, const float *src, float mul, int n) {
    __m512 vm = _mm512_set1_ps(mul);
    for (int k = 0; k < n; k += 16) {
        __mmask16 m = tail16(k, n);
        store16(p, bf16, i + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + k), vm));
    }
}

/* exp(x), to ~2 ulp: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor series to r^7 / 7!,
 * then scaled by 2^n. x below -104 (and -inf) gives 0. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* r[j][p] -> r[p][j] for 16 vectors of 16 32-bit values: pairs within 128-bit lanes, then
 * pairs of pairs, leaving r[4 g + q] with rows 4 g .. 4 g + 3 of column 4 L + q in lane L;
 * then the lanes, four vectors at a time */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int q = 0; q < 4; q++) {
        __m512i u0 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0x44);      /* A0 A1 B0 B1 */
        __m512i u1 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0xEE);      /* A2 A3 B2 B3 */
        __m512i u2 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0x44); /* C0 C1 D0 D1 */
        __m512i u3 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0xEE); /* C2 C3 D2 D3 */
        t[q] = _mm512_shuffle_i32x4(u0, u2, 0x88);                    /* A0 B0 C0 D0 */
        t[4 + q] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
        t[8 + q] = _mm512_shuffle_i32x4(u1, u3, 0x88);
        t[12 + q] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}
#endif
