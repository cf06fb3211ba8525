/* int8 weight-only matrix product for CPUs with AVX-512 (compiled on first use by
 * scratchgpt/models/int8_kernel.py; see there for why it exists).
 *
 *   y[m, n] = scale[n] * sum_k x[m, k] * w[n, k]  (+ bias[n])
 *
 *   x: (M, K) fp32 activations      w: (N, K) int8 weights, K a multiple of 16
 *   scale, bias: (N,) fp32          y: (M, N) fp32
 *
 * Decoding is bound by reading the weights, so each int8 weight is read once, widened to fp32 in
 * registers (16 at a time) and multiplied with up to 4 activation rows while it is there. Four
 * weight rows are worked on together so that their sums are independent chains of FMAs (one
 * chain would wait on the FMA latency). Every output keeps its own 16-lane partial sums over k,
 * reduced at the end, in the same order whatever M is, so a row's result does not depend on
 * which other rows share the call (a batch equals its rows alone).
 *
 * Prefetch: widening and multiplying keep the core busy enough that, left to the hardware
 * prefetcher, too few reads are in flight to stream at the memory bandwidth (without the
 * prefetch this kernel decoded GPT-2 124M no faster than PyTorch's). So each step asks for the
 * bytes PREFETCH ahead of the ones it reads, a few blocks early.
 *
 * Threads: the weight rows are split into one contiguous range per OpenMP thread. Built against
 * the libgomp that PyTorch has already loaded, this uses PyTorch's own thread pool.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define ROWS_N 4 /* weight rows per block */
#define ROWS_M 4 /* activation rows per block */
#ifndef PREFETCH
#define PREFETCH 4096
#endif

static inline __m512 widen16(const int8_t *p) { /* 16 int8 -> 16 fp32 */
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* sums[i][j] = x[i] . w[j] for nw (1..4) weight rows and nx (1..4) activation rows */
static void dot_block(const float *x, int nx, const int8_t *w, int nw, int K,
                      float sums[ROWS_M][ROWS_N]) {
    __m512 acc[ROWS_M][ROWS_N];
    for (int i = 0; i < ROWS_M; i++)
        for (int j = 0; j < ROWS_N; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        /* the block is ROWS_N * K contiguous bytes, read in K / 16 steps of 16 bytes a row:
         * one 64-byte line PREFETCH bytes ahead per step keeps the next blocks streaming in */
        _mm_prefetch((const char *)w + PREFETCH + ROWS_N * k, _MM_HINT_T0);
        __m512 wv[ROWS_N];
        for (int j = 0; j < nw; j++) wv[j] = widen16(w + (long)j * K + k);
        for (int i = 0; i < nx; i++) {
            __m512 xv = _mm512_loadu_ps(x + (long)i * K + k);
            for (int j = 0; j < nw; j++) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
        }
    }
    for (int i = 0; i < nx; i++)
        for (int j = 0; j < nw; j++) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

/* The blocks above, specialised for the shapes that matter so the compiler unrolls them:
 * one activation row (a decode step) and full blocks of four. */
static void dot_block_dispatch(const float *x, int nx, const int8_t *w, int nw, int K,
                               float sums[ROWS_M][ROWS_N]) {
    if (nx == 1 && nw == ROWS_N) dot_block(x, 1, w, ROWS_N, K, sums);
    else if (nx == ROWS_M && nw == ROWS_N) dot_block(x, ROWS_M, w, ROWS_N, K, sums);
    else dot_block(x, nx, w, nw, K, sums);
}

static void rows(const float *x, int M, int K, const int8_t *w, const float *scale,
                 const float *bias, float *y, int N, int n0, int n1) {
    float sums[ROWS_M][ROWS_N];
    for (int n = n0; n < n1; n += ROWS_N) {
        int nw = n1 - n < ROWS_N ? n1 - n : ROWS_N;
        for (int m = 0; m < M; m += ROWS_M) {
            int nx = M - m < ROWS_M ? M - m : ROWS_M;
            dot_block_dispatch(x + (long)m * K, nx, w + (long)n * K, nw, K, sums);
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
    int blocks = (N + ROWS_N - 1) / ROWS_N;
    if (threads > blocks) threads = blocks;
    if (threads <= 1) {
        rows(x, M, K, w, scale, bias, y, N, 0, N);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        int per = (blocks + T - 1) / T;
        int n0 = t * per * ROWS_N, n1 = (t + 1) * per * ROWS_N;
        if (n1 > N) n1 = N;
        if (n0 < n1) rows(x, M, K, w, scale, bias, y, N, n0, n1);
    }
}
