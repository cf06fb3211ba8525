/* The elementwise work of a transformer block's training step, for CPUs with AVX-512: the
 * LayerNorms (forward and backward), the residual adds and the MLP's activation, each one pass
 * over rows, with the bf16 casts the products around them need fused in.
 * Compiled on first use (scratchgpt/models/c_kernels.py) and called by
 * scratchgpt/models/block_ops.py, which says why it exists and when it is used.
 *
 * Rows: a (N, C) tensor is N rows of C contiguous features. fp32 is the residual stream, bf16
 * the products' inputs and outputs (what bf16 autocast gives them; in an fp32 evaluation they
 * are fp32 too). Every sum is fp32; bf16 results are rounded to nearest even, as torch's
 * conversion does.
 *
 *   ln_forward:    x1 = x (+ res)                           (fp32, written when res is given)
 *                  h = (x1 - mean) * rstd * w (+ b)         (bf16 or fp32), rstd = 1 / sqrt(var + eps)
 *   ln_backward:   xhat = (x - mean) * rstd,  g = dh * w
 *                  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ dres)   (fp32, and bf16)
 *                  dw = sum over rows of dh * xhat,  db = sum of dh
 *   residual_add:  out = x + y                              (fp32 from fp32 and bf16 or fp32)
 *   act_forward / act_backward: bf16 f, a table lookup of any activation's value or derivative
 *   act_forward_fp32: GELU (exact, or its tanh form), ReLU, ReLU^2 computed in fp32
 *   convert_many:  several tensors fp32 -> bf16 or bf16 -> fp32 in one call
 *
 * Threads: rows are split between PyTorch's OpenMP threads (built against the libgomp PyTorch
 * has loaded), each a run of consecutive rows (a LayerNorm's in groups of LN_ROWS), a thread
 * done with its run taking the last rows of a slower one's (shares.h: no row's result depends
 * on which thread computes it). The LayerNorm's backward keeps fixed shares, since each
 * thread's share of dw and db is summed in thread order: a call gives the same bits every time
 * for the same thread count.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shares.h" /* rows and values shared between the threads */
#include "simd16.h" /* 16-wide loads, stores and exp */

/* the threads worth waking for n values: one below PyTorch's own grain for elementwise work */
static int threads_for(long n, int threads) { return n < 32768 ? 1 : threads; }

/* Elementwise loops share their values between the threads in pieces of PIECE (shares.h); the
 * values of piece i are [i PIECE, piece_end(i, n)). */
#define PIECE 4096
static inline long pieces(long n) { return (n + PIECE - 1) / PIECE; }
static inline long piece_end(long i, long n) { return (i + 1) * PIECE < n ? (i + 1) * PIECE : n; }

/* Rows normalized together. A row's work is a chain of dependent steps (a sum, its reduction,
 * the squares' sum, its reduction, the square root), too short for the processor to overlap
 * one row with the next on its own: written side by side, LN_ROWS rows' chains run
 * interleaved. Each row's arithmetic, and so its result, is that of a row alone. */
#define LN_ROWS 4

/* n rows (n = LN_ROWS, or 1 for the last few) of ln_forward: x1 (n, C) -> h (bf16 or fp32),
 * their means and rstds. Inlined for each n, so that its loops over rows unroll. */
static inline __attribute__((always_inline)) void ln_rows(int n, const float *x, const float *w,
                                                          const float *b, float eps, int C,
                                                          void *h, int bf16, float *mean,
                                                          float *rstd) {
    __m512 s[LN_ROWS], q[LN_ROWS], vmu[LN_ROWS];
    float r[LN_ROWS];
    for (int j = 0; j < n; j++) s[j] = q[j] = _mm512_setzero_ps();
    for (int k = 0; k < C; k += 16)
        for (int j = 0; j < n; j++) s[j] = _mm512_add_ps(s[j], load16(x + (long)j * C, 0, k, tail16(k, C)));
    for (int j = 0; j < n; j++) mean[j] = _mm512_reduce_add_ps(s[j]) / C, vmu[j] = _mm512_set1_ps(mean[j]);
    for (int k = 0; k < C; k += 16) {
        __mmask16 m = tail16(k, C);
        for (int j = 0; j < n; j++) {
            __m512 d = _mm512_maskz_sub_ps(m, load16(x + (long)j * C, 0, k, m), vmu[j]);
            q[j] = _mm512_fmadd_ps(d, d, q[j]);
        }
    }
    for (int j = 0; j < n; j++) r[j] = rstd[j] = 1.0f / sqrtf(_mm512_reduce_add_ps(q[j]) / C + eps);
    for (int j = 0; j < n; j++) {
        __m512 vr = _mm512_set1_ps(r[j]), shift = _mm512_set1_ps(-mean[j] * r[j]);
        void *hj = bf16 ? (void *)((uint16_t *)h + (long)j * C) : (void *)((float *)h + (long)j * C);
        for (int k = 0; k < C; k += 16) {
            __mmask16 m = tail16(k, C);
            __m512 y = _mm512_mul_ps(_mm512_fmadd_ps(load16(x + (long)j * C, 0, k, m), vr, shift), load16(w, 0, k, m));
            if (b) y = _mm512_add_ps(y, load16(b, 0, k, m));
            store16(hj, bf16, k, m, y);
        }
    }
}

/* rows i0 .. i0 + n of ln_forward (x1 = x + res first, when res is given) */
static inline __attribute__((always_inline)) void ln_forward_rows(
    int n, int i0, int C, const float *x, const void *res, float *x1, const float *w,
    const float *b, float eps, void *h, float *mean, float *rstd, int bf16) {
    long at = (long)i0 * C;
    const float *xi = x + at;
    if (res) {
        for (long k = 0; k < (long)n * C; k += 16) {
            __mmask16 m = tail16(k, (long)n * C);
            _mm512_mask_storeu_ps(x1 + at + k, m, _mm512_add_ps(load16(xi, 0, k, m), load16(res, bf16, at + k, m)));
        }
        xi = x1 + at;
    }
    ln_rows(n, xi, w, b, eps, C, bf16 ? (void *)((uint16_t *)h + at) : (void *)((float *)h + at), bf16,
            mean + i0, rstd + i0);
}

/* LayerNorm of N rows of x (+ res, summed into x1 first when given) into h, keeping each row's
 * mean and rstd for the backward; res and h are bf16 (bf16 = 1) or fp32. b may be NULL (no
 * shift). */
void ln_forward(int N, int C, const float *x, const void *res, float *x1, const float *w,
                const float *b, float eps, void *h, float *mean, float *rstd, int bf16, int threads) {
    int groups = N / LN_ROWS;
    Shares sh;
#pragma omp parallel num_threads(threads_for((long)N * C, threads))
    {
        int t = shares_begin(&sh, groups);
        for (long g; (g = take(&sh, t)) >= 0;)
            ln_forward_rows(LN_ROWS, (int)g * LN_ROWS, C, x, res, x1, w, b, eps, h, mean, rstd, bf16);
#pragma omp single nowait
        for (int i = groups * LN_ROWS; i < N; i++)  /* the few rows left */
            ln_forward_rows(1, i, C, x, res, x1, w, b, eps, h, mean, rstd, bf16);
    }
}

/* out = x + y over n values: the residual stream (fp32) plus a product's output (bf16 when
 * bf16 = 1, else fp32) */
void residual_add(long n, const float *x, const void *y, float *out, int bf16, int threads) {
    Shares sh;
#pragma omp parallel num_threads(threads_for(n, threads))
    for (long i, t = shares_begin(&sh, pieces(n)); (i = take(&sh, (int)t)) >= 0;)
        for (long k = i * PIECE; k < piece_end(i, n); k += 16) {
            __mmask16 m = tail16(k, n);
            _mm512_mask_storeu_ps(out + k, m, _mm512_add_ps(load16(x, 0, k, m), load16(y, bf16, k, m)));
        }
}

/* rows i0 .. i0 + n (n = LN_ROWS, or 1 for the last few; interleaved as in ln_rows) of
 * ln_backward: dx (and dx16) from dh; dh * xhat and dh added into this thread's dw and db, row
 * after row. dres may be NULL; dx16 and db too. */
static inline __attribute__((always_inline)) void ln_back_rows(
    int n, int i0, int C, const uint16_t *dh, const float *x, const float *mean, const float *rstd,
    const float *w, const float *dres, float *dx, uint16_t *dx16, float *dw, float *db) {
    long at0 = (long)i0 * C;
    dh += at0, x += at0, dx += at0, mean += i0, rstd += i0;
    if (dres) dres += at0;
    if (dx16) dx16 += at0;
    __m512 vmu[LN_ROWS], vr[LN_ROWS], sg[LN_ROWS], sgx[LN_ROWS], mg[LN_ROWS], mgx[LN_ROWS];
    for (int j = 0; j < n; j++) {
        vmu[j] = _mm512_set1_ps(mean[j]), vr[j] = _mm512_set1_ps(rstd[j]);
        sg[j] = sgx[j] = _mm512_setzero_ps();
    }
    for (int k = 0; k < C; k += 16) {
        __mmask16 m = tail16(k, C);
        __m512 wk = load16(w, 0, k, m), dwk = load16(dw, 0, k, m);
        __m512 dbk = db ? load16(db, 0, k, m) : _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            __m512 d = load16(dh + (long)j * C, 1, k, m);
            __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(load16(x + (long)j * C, 0, k, m), vmu[j]), vr[j]);
            __m512 g = _mm512_mul_ps(d, wk);
            sg[j] = _mm512_add_ps(sg[j], g);
            sgx[j] = _mm512_fmadd_ps(g, xhat, sgx[j]);
            dwk = _mm512_fmadd_ps(d, xhat, dwk);
            if (db) dbk = _mm512_add_ps(d, dbk);
        }
        _mm512_mask_storeu_ps(dw + k, m, dwk);
        if (db) _mm512_mask_storeu_ps(db + k, m, dbk);
    }
    for (int j = 0; j < n; j++) {
        mg[j] = _mm512_set1_ps(_mm512_reduce_add_ps(sg[j]) / C);
        mgx[j] = _mm512_set1_ps(_mm512_reduce_add_ps(sgx[j]) / C);
    }
    for (int j = 0; j < n; j++) {
        long at = (long)j * C;
        for (int k = 0; k < C; k += 16) {
            __mmask16 m = tail16(k, C);
            __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(load16(x + at, 0, k, m), vmu[j]), vr[j]);
            __m512 g = _mm512_mul_ps(load16(dh + at, 1, k, m), load16(w, 0, k, m));
            __m512 v = _mm512_mul_ps(vr[j], _mm512_sub_ps(_mm512_sub_ps(g, mg[j]), _mm512_mul_ps(xhat, mgx[j])));
            if (dres) v = _mm512_add_ps(v, load16(dres + at, 0, k, m));
            _mm512_mask_storeu_ps(dx + at + k, m, v);
            if (dx16) store16(dx16 + at, 1, k, m, v);
        }
    }
}

/* The LayerNorm's backward over N rows: dx (fp32, plus dres when given; also rounded into
 * dx16 when given), dw and db (db may be NULL: no shift). Returns 0, or 1 when there was no
 * memory for the threads' partial sums. */
int ln_backward(int N, int C, const uint16_t *dh, const float *x, const float *mean,
                const float *rstd, const float *w, const float *dres, float *dx, uint16_t *dx16,
                float *dw, float *db, int threads) {
    threads = threads_for((long)N * C, threads);
    float *part = calloc((size_t)threads * 2 * C, sizeof(float)); /* per thread: dw, then db */
    if (!part) return 1;
    int used = 1;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num();
        float *pw = part + (long)t * 2 * C, *pb = db ? pw + C : NULL;
#pragma omp single
        used = omp_get_num_threads();
        /* each thread its share of whole groups, then of the rows left (as in ln_forward) */
#pragma omp for schedule(static) nowait
        for (int g = 0; g < N / LN_ROWS; g++)
            ln_back_rows(LN_ROWS, g * LN_ROWS, C, dh, x, mean, rstd, w, dres, dx, dx16, pw, pb);
#pragma omp for schedule(static)
        for (int i = N / LN_ROWS * LN_ROWS; i < N; i++)
            ln_back_rows(1, i, C, dh, x, mean, rstd, w, dres, dx, dx16, pw, pb);
    }
    for (int k = 0; k < C; k++) { /* the threads' shares, in thread order */
        float sw = 0.0f, sb = 0.0f;
        for (int t = 0; t < used; t++) sw += part[(long)t * 2 * C + k], sb += part[(long)t * 2 * C + C + k];
        dw[k] = sw;
        if (db) db[k] = sb;
    }
    free(part);
    return 0;
}

/* 16 bf16 values at p + k (those in mask m) as indices into a table of all 65536 */
static inline __m512i bf16_index(const uint16_t *p, long k, __mmask16 m) {
    return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p + k));
}

/* g = act(f) over n bf16 values: table[f], the activation of every bf16 value (fp32, each one
 * a bf16 value, so storing it as bf16 is exact) */
void act_forward(long n, const float *table, const uint16_t *f, uint16_t *g, int threads) {
    Shares sh;
#pragma omp parallel num_threads(threads_for(n, threads))
    for (long i, t = shares_begin(&sh, pieces(n)); (i = take(&sh, (int)t)) >= 0;)
        for (long k = i * PIECE; k < piece_end(i, n); k += 16) {
            __mmask16 m = tail16(k, n);
            __m512i v = _mm512_castps_si512(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, bf16_index(f, k, m), table, 4));
            _mm256_mask_storeu_epi16(g + k, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
        }
}

/* df = dg * table[f] over n bf16 values, rounded: table holds act' of every bf16 value */
void act_backward(long n, const float *table, const uint16_t *dg, const uint16_t *f, uint16_t *df,
                  int threads) {
    Shares sh;
#pragma omp parallel num_threads(threads_for(n, threads))
    for (long i, t = shares_begin(&sh, pieces(n)); (i = take(&sh, (int)t)) >= 0;)
        for (long k = i * PIECE; k < piece_end(i, n); k += 16) {
            __mmask16 m = tail16(k, n);
            __m512 d = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, bf16_index(f, k, m), table, 4);
            store16(df, 1, k, m, _mm512_mul_ps(load16(dg, 1, k, m), d));
        }
}

/* dst[i] = src[i] for count tensors of n[i] values: fp32 rounded to bf16 (to_bf16 = 1: the
 * products' weights) or bf16 widened to fp32 (to_bf16 = 0: the weights' gradients) */
void convert_many(int count, const void *const *src, void *const *dst, const long *n, int to_bf16,
                  int threads) {
    long total = 0;
    for (int i = 0; i < count; i++) total += n[i];
#pragma omp parallel num_threads(threads_for(total, threads))
    for (int i = 0; i < count; i++) {
#pragma omp for schedule(static) nowait
        for (long k = 0; k < n[i]; k += 16) {
            __mmask16 m = tail16(k, n[i]);
            store16(dst[i], to_bf16, k, m, load16(src[i], !to_bf16, k, m));
        }
    }
}

/* 1 / x: the 14-bit estimate and one Newton step (a division's accuracy, at a fraction of its
 * cost) */
static inline __m512 recip16(__m512 x) {
    __m512 r = _mm512_rcp14_ps(x);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(x, r, _mm512_set1_ps(2.0f)));
}

/* Phi(x), the normal distribution's CDF, as 0.5 erfc(|x| / sqrt 2) for x < 0 and 1 minus that
 * for x >= 0, erfc by Abramowitz and Stegun 7.1.26 (t p(t) exp(-z^2), erf to ~1.5e-7): no
 * 1 + erf(x) that cancels for x well below 0, where Phi is small */
static inline __m512 phi16(__m512 x) {
    __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
    __m512 t = recip16(_mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), z, _mm512_set1_ps(1.0f)));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    __m512 tail = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), _mm512_mul_ps(p, t)),
                                exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), z), z)));
    __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(negative, _mm512_sub_ps(_mm512_set1_ps(1.0f), tail), tail);
}

/* 1 / (1 + exp(-v)), the exponent held below 80 (its overflow would make the reciprocal's
 * Newton step NaN; the result is 0 to fp32 long before) */
static inline __m512 sigmoid16(__m512 v) {
    __m512 e = exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), v), _mm512_set1_ps(80.0f)));
    return recip16(_mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}

/* the activation of 16 fp32 values: kind 0 GELU (exact, x Phi(x)), 1 GELU's tanh form (as
 * x sigmoid(2u): 0.5 (1 + tanh u) = sigmoid(2u), with no cancellation for x well below 0),
 * 2 ReLU, 3 ReLU^2 (fused_block's "none", "tanh", "relu", "relu2") */
static inline __m512 act16(__m512 f, int kind) {
    if (kind == 0) return _mm512_mul_ps(f, phi16(f));
    if (kind == 1) { /* u = sqrt(2 / pi) (f + 0.044715 f^3) */
        __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.79788456080286536f),
                                 _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), f), _mm512_mul_ps(f, f), f));
        return _mm512_mul_ps(f, sigmoid16(_mm512_add_ps(u, u)));
    }
    __m512 r = _mm512_max_ps(f, _mm512_setzero_ps());
    return kind == 2 ? r : _mm512_mul_ps(r, r);
}

/* g = act(f) over n fp32 values, computed (fp32 has too many values for a table) */
void act_forward_fp32(long n, int kind, const float *f, float *g, int threads) {
    Shares sh;
#pragma omp parallel num_threads(threads_for(n, threads))
    for (long i, t = shares_begin(&sh, pieces(n)); (i = take(&sh, (int)t)) >= 0;)
        for (long k = i * PIECE; k < piece_end(i, n); k += 16) {
            __mmask16 m = tail16(k, n);
            _mm512_mask_storeu_ps(g + k, m, act16(_mm512_maskz_loadu_ps(m, f + k), kind));
        }
}
