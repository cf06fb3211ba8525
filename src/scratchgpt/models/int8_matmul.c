/* int8 weight-only matrix product for CPUs with AVX-512 and its bf16 dot product (AVX512-BF16),
 * compiled on first use by scratchgpt/models/int8_kernel.py (see there for why it exists).
 * decode_step.c includes this file: its int8 products are these blocks, summed the same way.
 *
 *   y[m, n] = scale[n] * sum_k bf16(x[m, k]) * w[n, k]  (+ bias[n])
 *
 *   x: (M, K) fp32 activations, rounded to bf16 (nearest even) before the product
 *   w: (N, K) int8 weights, K a multiple of 16      scale, bias: (N,) fp32      y: (M, N) fp32
 *
 * Arithmetic: an int8 weight is exact in bf16 (8 significant bits), so widening it loses
 * nothing; the activations are rounded to bf16. vdpbf16ps then multiplies 32 pairs of bf16 and
 * adds them, two by two, to 16 fp32 sums, twice the multiply-adds of an fp32 FMA per
 * instruction. That is what makes a prompt (many activation rows) about twice as fast as in fp32
 * arithmetic; a decode step (one row) is bound by reading the weights either way.
 *
 * Blocks: four weight rows are worked on together so that their sums are independent chains
 * (one chain would wait on the latency), each with up to four activation rows while the widened
 * weights are in registers. Every output keeps its own 16-lane sums over k, reduced at the end,
 * in the same order whatever M is, so a row's result does not depend on which other rows share
 * the call (a batch equals its rows alone, bit for bit).
 *
 * Two ways to the same sums: with few activation rows each step widens its 32 weights of each
 * row in registers; with many, each block of weight rows is widened once into a bf16 buffer that
 * every block of activation rows then reads (i8_dot's from_buffer), so the widening is not
 * repeated M / 4 times. Both feed the same bf16 values to the same instructions in the same
 * order: the same bits.
 *
 * Prefetch: widening and multiplying keep the core busy enough that, left to the hardware
 * prefetcher, too few reads are in flight to stream at the memory bandwidth. So each step asks
 * for the bytes PREFETCH ahead of the ones it reads, a few blocks early.
 *
 * Threads: the weight rows are split into one contiguous range per OpenMP thread. Built against
 * the libgomp that PyTorch has already loaded, this uses PyTorch's own thread pool.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef __AVX512BF16__
#error "the int8 product needs AVX512-BF16 (vdpbf16ps)"
#endif

#define I8_ROWS_N 4 /* weight rows per block */
#define I8_ROWS_M 4 /* activation rows per block */
#define I8_WIDEN_FROM 8 /* activation rows from which a block of weights is widened once */
#ifndef PREFETCH
#define PREFETCH 4096
#endif

typedef float i8_sums[I8_ROWS_M][I8_ROWS_N];

/* Unrolled early: GCC then keeps a block's 16 sums in registers; left to its later unrolling,
 * the sums array stays in memory and every step stores all 16 (measured: half the speed). */
#define I8_UNROLL _Pragma("GCC unroll 4")

/* which of the 32 elements from k on exist: all, or the 16 of a row's last half-step */
static inline __mmask32 i8_mask(int k, int K) { return K - k >= 32 ? 0xFFFFFFFFu : 0xFFFFu; }

/* 32 int8 weights (masked ones 0) -> 32 bf16, exactly */
static inline __m512i i8_widen32(const int8_t *p, __mmask32 m) {
    __m256i b = _mm256_maskz_loadu_epi8(m, p);
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* acc += x . w, 32 elements, two by two into 16 lanes */
static inline __m512 i8_dp(__m512 acc, __m512i x, __m512i w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
}

/* sums[i][j] = x[i] . w[j] for nx (1..4) bf16 activation rows (xstride elements apart) and nw
 * (1..4) weight rows: int8 rows wstride bytes apart, widened in registers at every step, or
 * (from_buffer) the same rows already widened by i8_widen_rows into wb, read from there. The
 * same bf16 values meet the same instructions in the same order either way. */
static inline __attribute__((always_inline)) void
i8_dot(const uint16_t *x, long xstride, int nx, const int8_t *w, long wstride,
       const uint16_t *wb, int from_buffer, int nw, int K, i8_sums sums) {
    int K32 = (K + 31) & ~31;
    __m512 acc[I8_ROWS_M][I8_ROWS_N];
    I8_UNROLL for (int i = 0; i < I8_ROWS_M; i++)
        I8_UNROLL for (int j = 0; j < I8_ROWS_N; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        __mmask32 m = i8_mask(k, K);
        __m512i wv[I8_ROWS_N];
        if (from_buffer) {
            I8_UNROLL for (int j = 0; j < nw; j++)
                wv[j] = _mm512_loadu_si512(wb + (long)j * K32 + k);
        } else {
            /* a step reads 32 bytes of each of the 4 rows: prefetch as many PREFETCH ahead */
            const char *ahead = (const char *)w + PREFETCH + (long)I8_ROWS_N * k;
            _mm_prefetch(ahead, _MM_HINT_T0);
            _mm_prefetch(ahead + 64, _MM_HINT_T0);
            I8_UNROLL for (int j = 0; j < nw; j++) wv[j] = i8_widen32(w + j * wstride + k, m);
        }
        I8_UNROLL for (int i = 0; i < nx; i++) {
            __m512i xv = _mm512_maskz_loadu_epi16(m, x + i * xstride + k);
            I8_UNROLL for (int j = 0; j < nw; j++) acc[i][j] = i8_dp(acc[i][j], xv, wv[j]);
        }
    }
    I8_UNROLL for (int i = 0; i < nx; i++)
        I8_UNROLL for (int j = 0; j < nw; j++) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

/* wb (4, K32) = bf16 of nw int8 rows, zero past K and past row nw (K32: K rounded up to 32) */
static void i8_widen_rows(const int8_t *w, long wstride, int nw, int K, uint16_t *wb) {
    int K32 = (K + 31) & ~31;
    for (int j = 0; j < I8_ROWS_N; j++)
        for (int k = 0; k < K32; k += 32) {
            __m512i v = _mm512_setzero_si512();
            if (j < nw) {
                _mm_prefetch((const char *)w + j * wstride + k + PREFETCH, _MM_HINT_T0);
                v = i8_widen32(w + j * wstride + k, i8_mask(k, K));
            }
            _mm512_storeu_si512(wb + (long)j * K32 + k, v);
        }
}

/* Each shape gets its own function, so that the compiler keeps its sums in registers (inlined
 * side by side into one function, the copies shared one stack frame and spilled every step):
 * one activation row (a decode step), full blocks, and any other block at the edges. */
#define I8_SHAPE(name, body, ...) \
    static __attribute__((noinline)) void name(__VA_ARGS__) { body; }
I8_SHAPE(i8_rows_1x4, i8_dot(x, xs, 1, w, ws, NULL, 0, I8_ROWS_N, K, sums),
         const uint16_t *x, long xs, const int8_t *w, long ws, int K, i8_sums sums)
I8_SHAPE(i8_rows_4x4, i8_dot(x, xs, I8_ROWS_M, w, ws, NULL, 0, I8_ROWS_N, K, sums),
         const uint16_t *x, long xs, const int8_t *w, long ws, int K, i8_sums sums)
I8_SHAPE(i8_rows_edge, i8_dot(x, xs, nx, w, ws, NULL, 0, nw, K, sums),
         const uint16_t *x, long xs, int nx, const int8_t *w, long ws, int nw, int K,
         i8_sums sums)
I8_SHAPE(i8_widened_4x4, i8_dot(x, xs, I8_ROWS_M, NULL, 0, wb, 1, I8_ROWS_N, K, sums),
         const uint16_t *x, long xs, const uint16_t *wb, int K, i8_sums sums)
I8_SHAPE(i8_widened_edge, i8_dot(x, xs, nx, NULL, 0, wb, 1, nw, K, sums),
         const uint16_t *x, long xs, int nx, const uint16_t *wb, int nw, int K, i8_sums sums)

/* sums from int8 rows w (wstride bytes apart), widened in registers */
static void i8_dot_rows_any(const uint16_t *x, long xstride, int nx, const int8_t *w,
                            long wstride, int nw, int K, i8_sums sums) {
    if (nx == 1 && nw == I8_ROWS_N) i8_rows_1x4(x, xstride, w, wstride, K, sums);
    else if (nx == I8_ROWS_M && nw == I8_ROWS_N) i8_rows_4x4(x, xstride, w, wstride, K, sums);
    else i8_rows_edge(x, xstride, nx, w, wstride, nw, K, sums);
}

/* sums from the rows i8_widen_rows put in wb */
static void i8_dot_widened_any(const uint16_t *x, long xstride, int nx, const uint16_t *wb,
                               int nw, int K, i8_sums sums) {
    if (nx == I8_ROWS_M && nw == I8_ROWS_N) i8_widened_4x4(x, xstride, wb, K, sums);
    else i8_widened_edge(x, xstride, nx, wb, nw, K, sums);
}

/* sums for nx rows of x and nw weight rows: from wb where i8_widen_rows filled it (many rows
 * of x), else from the int8 rows w, widened at every step */
static void i8_block(const uint16_t *x, long xstride, int nx, const int8_t *w, long wstride,
                     const uint16_t *wb, int nw, int K, i8_sums sums) {
    if (wb) i8_dot_widened_any(x, xstride, nx, wb, nw, K, sums);
    else i8_dot_rows_any(x, xstride, nx, w, wstride, nw, K, sums);
}

/* xb (K,) = x (n,) rounded to bf16 (nearest even), zero from n to K (K: a multiple of 16) */
static void i8_round_row(const float *x, int n, int K, uint16_t *xb) {
    for (int k = 0; k < K; k += 16) {
        __mmask16 m = n - k >= 16 ? 0xFFFF : n > k ? (__mmask16)((1u << (n - k)) - 1) : 0;
        _mm256_storeu_si256((__m256i *)(xb + k),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k)));
    }
}

/* y rows [n0, n1) of the product; wb: scratch of 4 * K32 bf16, or NULL for few rows */
static void i8_rows(const uint16_t *xb, int M, int K, const int8_t *w, const float *scale,
                    const float *bias, float *y, int N, int n0, int n1, uint16_t *wb) {
    i8_sums sums;
    for (int n = n0; n < n1; n += I8_ROWS_N) {
        int nw = n1 - n < I8_ROWS_N ? n1 - n : I8_ROWS_N;
        const int8_t *wn = w + (long)n * K;
        if (wb) i8_widen_rows(wn, K, nw, K, wb);
        for (int m = 0; m < M; m += I8_ROWS_M) {
            int nx = M - m < I8_ROWS_M ? M - m : I8_ROWS_M;
            i8_block(xb + (long)m * K, K, nx, wn, K, wb, nw, K, sums);
            for (int i = 0; i < nx; i++)
                for (int j = 0; j < nw; j++) {
                    float v = sums[i][j] * scale[n + j];
                    y[(long)(m + i) * N + n + j] = bias ? v + bias[n + j] : v;
                }
        }
    }
}

void int8_matmul(const float *x, int M, int K, const int8_t *w, const float *scale,
                 const float *bias, float *y, int N, int threads) {
    int blocks = (N + I8_ROWS_N - 1) / I8_ROWS_N;
    uint16_t *xb = malloc((size_t)M * K * sizeof(uint16_t));
    int widen = M >= I8_WIDEN_FROM;
    if (!xb) abort();
    for (int m = 0; m < M; m++) i8_round_row(x + (long)m * K, K, K, xb + (long)m * K);
    if (threads > blocks) threads = blocks;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        int per = (blocks + T - 1) / T;
        int n0 = t * per * I8_ROWS_N, n1 = (t + 1) * per * I8_ROWS_N;
        uint16_t *wb = widen ? aligned_alloc(64, I8_ROWS_N * (size_t)((K + 31) & ~31) * 2) : NULL;
        if (widen && !wb) abort();
        if (n1 > N) n1 = N;
        if (n0 < n1) i8_rows(xb, M, K, w, scale, bias, y, N, n0, n1, wb);
        free(wb);
    }
    free(xb);
}
