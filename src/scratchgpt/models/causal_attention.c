/* Causal self-attention for training, forward and backward, for CPUs with AVX-512.
 * Compiled on first use (scratchgpt/models/c_kernels.py) and called by
 * scratchgpt/models/attention_kernel.py, which says why it exists and when it is used.
 *
 * Per (sequence b, head h), with queries, keys and values Q, K, V of shape (T, D) and
 * s = 1 / sqrt(D):
 *
 *   forward:   S = s Q K^T   (T, T), S[i, j] = -inf for j > i (a query sees only the past)
 *              P = softmax(S) row by row;  O = P V   (T, D);  lse[i] = log sum_j exp(S[i, j])
 *   backward:  from dO (T, D), recomputing P = exp(S - lse) rather than keeping it:
 *              dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * O))
 *              dQ = s dS K;  dK = s dS^T Q
 *
 * Inputs and outputs are fp32 or bf16 (all of one call in one dtype), each addressed by its own
 * strides (sequence, head, time; the D features of a row contiguous), so the kernel reads the
 * queries, keys and values straight out of the fused QKV projection (B, T, 3, H, D), writes the
 * output as (B, T, H, D) = (B, T, C) for the output projection, and the backward writes dQ, dK
 * and dV straight into one gradient of that projection: no transposes, no copies. Everything in
 * between is fp32: each (b, h) pair's rows are widened into thread-local fp32 buffers padded to
 * a multiple of 16 features (keys and values also transposed, so each score row is a run of
 * 16-wide multiply-adds over keys, with no horizontal sums). bf16 results are rounded to nearest
 * even, as torch's conversion does.
 *
 * Rotary positions (RoPE), when the call passes their tables: each query and key row, once
 * widened to fp32, has its pairs (x[i], x[i + D/2]) turned by position t's angles,
 * x[i] cos - x[i + D/2] sin and x[i] sin + x[i + D/2] cos, cos and sin read from (T, D/2) fp32
 * tables; the backward turns dQ and dK back by the same angles (the transpose of the rotation)
 * before storing them. So a rotary model, too, reads its heads straight from the projection.
 *
 * Threads: the (b, h) pairs are split between PyTorch's OpenMP threads (built against the
 * libgomp PyTorch has loaded), each a run of consecutive pairs, a thread done with its run
 * taking the last pairs of a slower one's (shares.h).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shares.h" /* the (b, h) pairs shared between the threads */
#include "simd16.h" /* 16-wide loads, stores and exp */

/* strides, in elements, of one tensor: from one sequence, one head, one time step to the next */
typedef struct {
    long b, h, t;
} Strides;

/* n values (fp32 or bf16) at p, widened to fp32 and times mul into dst[0 .. n), 0 after them
 * up to n16 */
static void widen_row(float *dst, const void *p, int bf16, int n, int n16, float mul) {
    __m512 vm = _mm512_set1_ps(mul);
    for (int k = 0; k < n16; k += 16)
        _mm512_storeu_ps(dst + k, _mm512_mul_ps(load16(p, bf16, k, k < n ? tail16(k, n) : 0), vm));
}

static inline const void *row(const void *base, int bf16, const Strides *s, int b, int h, int t) {
    long i = b * s->b + h * s->h + t * s->t;
    return bf16 ? (const void *)((const uint16_t *)base + i) : (const void *)((const float *)base + i);
}

/* One thread's fp32 work space for one (b, h) pair: Tp rows of Dp features (T and D rounded up
 * to 16; the padding stays zero), keys and values also transposed (Dp rows of Tp keys), and R
 * rows of scores. */
#define R 8 /* query rows computed together: each key or value loaded serves R rows */
typedef struct {
    int T, D, Dp, Tp;
    float *q, *k, *v, *o, *dO, *dq, *dk, *dv, *kt, *vt, *s, *ds;
} Work;

static int work_alloc(Work *w, int T, int D) {
    w->T = T, w->D = D, w->Dp = (D + 15) / 16 * 16, w->Tp = (T + 15) / 16 * 16;
    long rows = (long)w->Tp * w->Dp, n = 10 * rows + 2 * R * w->Tp;
    /* q k v o dO dq dk dv, kt vt (transposed: as many floats), s ds (R score rows each) */
    float *mem = aligned_alloc(64, sizeof(float) * n);
    if (!mem) return 0;
    memset(mem, 0, sizeof(float) * n);
    float **slots[] = {&w->q, &w->k, &w->v, &w->o, &w->dO, &w->dq, &w->dk, &w->dv, &w->kt, &w->vt};
    for (int i = 0; i < 10; i++) *slots[i] = mem + i * rows;
    w->s = mem + 10 * rows, w->ds = w->s + R * w->Tp;
    return 1;
}

/* Each of the T rows of x (stride Dp) turned by its position's angles: forward (sign 1) or
 * back (sign -1, the transpose). cos, sin: (T, D/2) fp32. */
static void rotate_rows(const Work *w, float *x, const float *cos, const float *sin, float sign) {
    const int half = w->D / 2;
    const __m512 sg = _mm512_set1_ps(sign);
    for (int t = 0; t < w->T; t++) {
        float *x1 = x + (long)t * w->Dp, *x2 = x1 + half;
        for (int i = 0; i < half; i += 16) {
            __mmask16 m = tail16(i, half);
            __m512 a = _mm512_maskz_loadu_ps(m, x1 + i), b = _mm512_maskz_loadu_ps(m, x2 + i);
            __m512 c = _mm512_maskz_loadu_ps(m, cos + (long)t * half + i);
            __m512 sn = _mm512_mul_ps(sg, _mm512_maskz_loadu_ps(m, sin + (long)t * half + i));
            _mm512_mask_storeu_ps(x1 + i, m, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, sn)));
            _mm512_mask_storeu_ps(x2 + i, m, _mm512_fmadd_ps(a, sn, _mm512_mul_ps(b, c)));
        }
    }
}

/* the T rows of src (stride Dp) transposed into dst_t (Dp, Tp): 16 rows by 16 features at a
 * time, in registers (rows past T read as 0) */
static void transpose_rows(const Work *w, const float *src, float *dst_t) {
    for (int t = 0; t < w->T; t += 16)
        for (int d = 0; d < w->Dp; d += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = t + i < w->T ? _mm512_loadu_si512(src + (long)(t + i) * w->Dp + d) : _mm512_setzero_si512();
            transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst_t + (long)(d + j) * w->Tp + t, r[j]);
        }
}

/* the T rows of one (b, h) pair, times mul, into dst (Tp, Dp); turned by the rotary tables
 * when given; then transposed into dst_t (Dp, Tp) when given */
static void load_rows(const Work *w, float *dst, float *dst_t, const void *base, int bf16,
                      const Strides *st, int b, int h, float mul, const float *const *rope) {
    for (int t = 0; t < w->T; t++)
        widen_row(dst + (long)t * w->Dp, row(base, bf16, st, b, h, t), bf16, w->D, w->Dp, mul);
    if (rope) rotate_rows(w, dst, rope[0], rope[1], 1.0f);
    if (dst_t) transpose_rows(w, dst, dst_t);
}

/* s[r][j] = a[r] . bt[:, j] for R rows of a (stride Dp) and keys j0 <= j < j0 + 16 * NB */
#define SCORES(NB)                                                                          \
    static void scores##NB(const Work *w, const float *a, const float *bt, float *s, int j0) { \
        __m512 acc[R][NB];                                                                  \
        for (int r = 0; r < R; r++)                                                         \
            for (int u = 0; u < NB; u++) acc[r][u] = _mm512_setzero_ps();                   \
        for (int d = 0; d < w->D; d++) {                                                    \
            const float *b = bt + (long)d * w->Tp + j0;                                     \
            __m512 bu[NB];                                                                  \
            for (int u = 0; u < NB; u++) bu[u] = _mm512_loadu_ps(b + 16 * u);              \
            for (int r = 0; r < R; r++) {                                                   \
                __m512 ar = _mm512_set1_ps(a[(long)r * w->Dp + d]);                         \
                for (int u = 0; u < NB; u++) acc[r][u] = _mm512_fmadd_ps(ar, bu[u], acc[r][u]); \
            }                                                                               \
        }                                                                                   \
        for (int r = 0; r < R; r++)                                                         \
            for (int u = 0; u < NB; u++) _mm512_storeu_ps(s + (long)r * w->Tp + j0 + 16 * u, acc[r][u]); \
    }
SCORES(1)
SCORES(2)

/* s[r][j] = a[r] . bt[:, j] for R rows of a (stride Dp) and keys j < n (a multiple of 16);
 * s rows have stride Tp */
static void scores(const Work *w, const float *a, const float *bt, float *s, int n) {
    int j = 0;
    for (; j + 32 <= n; j += 32) scores2(w, a, bt, s, j);
    if (j < n) scores1(w, a, bt, s, j);
}

/* out[r] = sum_{j < n} p[r][j] rows[j] for R rows (p: stride Tp; rows, out: stride Dp) */
static void weighted_rows(const Work *w, const float *p, const float *rows, float *out, int n) {
    for (int d = 0; d < w->Dp; d += 32) {
        int two = d + 16 < w->Dp;
        __m512 acc[R][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const float *x = rows + (long)j * w->Dp + d;
            __m512 x0 = _mm512_loadu_ps(x), x1 = two ? _mm512_loadu_ps(x + 16) : _mm512_setzero_ps();
            for (int r = 0; r < R; r++) {
                __m512 pr = _mm512_set1_ps(p[(long)r * w->Tp + j]);
                acc[r][0] = _mm512_fmadd_ps(pr, x0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(pr, x1, acc[r][1]);
            }
        }
        for (int r = 0; r < R; r++) {
            _mm512_storeu_ps(out + (long)r * w->Dp + d, acc[r][0]);
            if (two) _mm512_storeu_ps(out + (long)r * w->Dp + d + 16, acc[r][1]);
        }
    }
}

/* rows[j] += sum_r p[r][j] x[r] for j < n (p: stride Tp; x, rows: stride Dp) */
static void add_outer(const Work *w, const float *p, const float *x, float *rows, int n) {
    for (int d = 0; d < w->Dp; d += 16) {
        __m512 xr[R];
        for (int r = 0; r < R; r++) xr[r] = _mm512_loadu_ps(x + (long)r * w->Dp + d);
        for (int j = 0; j < n; j++) {
            float *y = rows + (long)j * w->Dp + d;
            __m512 a = _mm512_mul_ps(_mm512_set1_ps(p[j]), xr[0]);
            __m512 b = _mm512_mul_ps(_mm512_set1_ps(p[w->Tp + j]), xr[1]);
            for (int r = 2; r < R; r += 2) {
                a = _mm512_fmadd_ps(_mm512_set1_ps(p[(long)r * w->Tp + j]), xr[r], a);
                b = _mm512_fmadd_ps(_mm512_set1_ps(p[(long)(r + 1) * w->Tp + j]), xr[r + 1], b);
            }
            _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), _mm512_add_ps(a, b)));
        }
    }
}

/* which of the 16 keys j .. j + 15 query row i sees: j <= i, and none for rows past T */
static inline __mmask16 visible(int j, int i, int T) { return i < T ? tail16(j, i + 1) : 0; }

/* query row i's scores s[0 .. n) to p = exp(s - top) on its visible keys, 0 elsewhere; returns
 * the sum (and *top, the largest score) */
static float softmax_row(float *s, int i, int T, int n, float *top) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16)
        vmax = _mm512_mask_max_ps(vmax, visible(j, i, T), vmax, _mm512_loadu_ps(s + j));
    float m = _mm512_reduce_max_ps(vmax);
    __m512 vm = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __m512 p = _mm512_maskz_mov_ps(visible(j, i, T), exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm)));
        _mm512_storeu_ps(s + j, p);
        sum = _mm512_add_ps(sum, p);
    }
    *top = m;
    return _mm512_reduce_add_ps(sum);
}

/* keys that R query rows from i0 may see, rounded up to 16 */
static inline int keys_for(const Work *w, int i0) {
    int n = (i0 + R + 15) / 16 * 16;
    return n < w->Tp ? n : w->Tp;
}

/* One call's tensors: its inputs (forward: q, k, v; backward: q, k, v, out, dout) and outputs
 * (forward: out; backward: dq, dk, dv), each with its strides, and lse (B, H, T): the forward
 * writes it, the backward reads it. */
typedef struct {
    int bf16, B, H, T, D;
    const void *in[5];
    void *out[3];
    Strides in_st[5], out_st[3];
    float *lse;
    const float *rope[2]; /* cos, sin (T, D/2) of rotary positions, or NULL */
} Call;

static void forward_pair(Work *w, const Call *c, int b, int h) {
    float *lse = c->lse + ((long)b * c->H + h) * c->T;
    const float *const *rope = c->rope[0] ? c->rope : NULL;
    load_rows(w, w->q, NULL, c->in[0], c->bf16, &c->in_st[0], b, h, 1.0f / sqrtf((float)w->D), rope); /* q scaled */
    load_rows(w, w->k, w->kt, c->in[1], c->bf16, &c->in_st[1], b, h, 1.0f, rope);
    load_rows(w, w->v, NULL, c->in[2], c->bf16, &c->in_st[2], b, h, 1.0f, NULL);
    for (int i0 = 0; i0 < w->T; i0 += R) {
        int n = keys_for(w, i0);
        float total[R], top;
        scores(w, w->q + (long)i0 * w->Dp, w->kt, w->s, n);
        for (int r = 0; r < R; r++) {
            total[r] = softmax_row(w->s + (long)r * w->Tp, i0 + r, w->T, n, &top);
            if (i0 + r < w->T) lse[i0 + r] = top + logf(total[r]);
        }
        weighted_rows(w, w->s, w->v, w->o, n);
        for (int r = 0; r < R && i0 + r < w->T; r++)
            store_row((void *)row(c->out[0], c->bf16, &c->out_st[0], b, h, i0 + r), c->bf16, 0,
                      w->o + (long)r * w->Dp, 1.0f / total[r], w->D);
    }
}

/* pair(w, c, b, h) for every (b, h), split between the threads, each with its own work space.
 * Returns 0, or 1 if a thread could not allocate its work space. */
static int for_each_pair(const Call *c, void (*pair)(Work *, const Call *, int, int), int threads) {
    int failed = 0;
    Shares sh;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        Work w;
        int t = shares_begin(&sh, (long)c->B * c->H);
        if (!work_alloc(&w, c->T, c->D)) {
            failed = 1; /* (its pairs are taken by the other threads) */
        } else {
            for (long bh; (bh = take(&sh, t)) >= 0;) pair(&w, c, (int)(bh / c->H), (int)(bh % c->H));
            free(w.q);
        }
    }
    return failed;
}

static Strides strides3(const long *s) { return (Strides){s[0], s[1], s[2]}; }

/* out = softmax(s Q K^T, causal) V for every (b, h); lse (B, H, T) fp32 is kept for the
 * backward. Returns 0, or 1 if a thread could not allocate its work space. */
int attention_forward(int bf16, int B, int H, int T, int D, const void *q, const long *qs,
                      const void *k, const long *ks, const void *v, const long *vs, void *out,
                      const long *os, float *lse, const float *cos, const float *sin,
                      int threads) {
    Call c = {.bf16 = bf16, .B = B, .H = H, .T = T, .D = D, .in = {q, k, v}, .out = {out},
              .in_st = {strides3(qs), strides3(ks), strides3(vs)}, .out_st = {strides3(os)},
              .lse = lse, .rope = {cos, sin}};
    return for_each_pair(&c, forward_pair, threads);
}

/* R query rows' P (into s, over dP) and dS (into ds) from their scores s and dP = dO V^T in ds */
static void probabilities(Work *w, int i0, int n, const float *lse) {
    for (int r = 0; r < R; r++) {
        int i = i0 + r;
        float *s = w->s + (long)r * w->Tp, *ds = w->ds + (long)r * w->Tp;
        __m512 dot = _mm512_setzero_ps(); /* delta_i = dO_i . O_i */
        for (int d = 0; d < w->Dp; d += 16)
            dot = _mm512_fmadd_ps(_mm512_loadu_ps(w->dO + (long)i * w->Dp + d), _mm512_loadu_ps(w->o + (long)i * w->Dp + d), dot);
        __m512 delta = _mm512_set1_ps(_mm512_reduce_add_ps(dot));
        __m512 l = _mm512_set1_ps(i < w->T ? lse[i] : 0.0f);
        for (int j = 0; j < n; j += 16) {
            __m512 p = _mm512_maskz_mov_ps(visible(j, i, w->T), exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), l)));
            _mm512_storeu_ps(s + j, p);
            _mm512_storeu_ps(ds + j, _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(ds + j), delta)));
        }
    }
}

static void backward_pair(Work *w, const Call *c, int b, int h) {
    const float *lse = c->lse + ((long)b * c->H + h) * c->T;
    float scale = 1.0f / sqrtf((float)w->D);
    const float *const *rope = c->rope[0] ? c->rope : NULL;
    float *rows[] = {w->q, w->k, w->v, w->o, w->dO}, *transposed[] = {NULL, w->kt, w->vt, NULL, NULL};
    for (int i = 0; i < 5; i++) /* q scaled and q, k turned, as in the forward */
        load_rows(w, rows[i], transposed[i], c->in[i], c->bf16, &c->in_st[i], b, h,
                  i == 0 ? scale : 1.0f, i < 2 ? rope : NULL);
    memset(w->dk, 0, sizeof(float) * w->T * w->Dp);
    memset(w->dv, 0, sizeof(float) * w->T * w->Dp);
    for (int i0 = 0; i0 < w->T; i0 += R) {
        int n = keys_for(w, i0);
        scores(w, w->q + (long)i0 * w->Dp, w->kt, w->s, n);   /* S = s Q K^T */
        scores(w, w->dO + (long)i0 * w->Dp, w->vt, w->ds, n); /* dP = dO V^T */
        probabilities(w, i0, n, lse);
        add_outer(w, w->s, w->dO + (long)i0 * w->Dp, w->dv, n);  /* dV[j] += P[i, j] dO_i */
        add_outer(w, w->ds, w->q + (long)i0 * w->Dp, w->dk, n);  /* dK[j] += dS[i, j] s Q_i */
        weighted_rows(w, w->ds, w->k, w->dq + (long)i0 * w->Dp, n); /* dQ_i = sum_j dS[i, j] K_j */
    }
    if (rope) { /* the gradients of the turned q and k, turned back */
        rotate_rows(w, w->dq, rope[0], rope[1], -1.0f);
        rotate_rows(w, w->dk, rope[0], rope[1], -1.0f);
    }
    float *res[] = {w->dq, w->dk, w->dv}, mul[] = {scale, 1.0f, 1.0f};
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < w->T; i++)
            store_row((void *)row(c->out[r], c->bf16, &c->out_st[r], b, h, i), c->bf16, 0,
                      res[r] + (long)i * w->Dp, mul[r], w->D);
}

/* dq, dk, dv from dout (and q, k, v, out, lse of the forward), for every (b, h). strides: 3 per
 * tensor, in the order q k v out dout dq dk dv. Returns 0, or 1 if a thread could not allocate
 * its work space. */
int attention_backward(int bf16, int B, int H, int T, int D, const void *q, const void *k,
                       const void *v, const void *out, const void *dout, const float *lse,
                       void *dq, void *dk, void *dv, const long *strides, const float *cos,
                       const float *sin, int threads) {
    Call c = {.bf16 = bf16, .B = B, .H = H, .T = T, .D = D, .in = {q, k, v, out, dout},
              .out = {dq, dk, dv}, .lse = (float *)lse, .rope = {cos, sin}};
    for (int i = 0; i < 5; i++) c.in_st[i] = strides3(strides + 3 * i);
    for (int i = 0; i < 3; i++) c.out_st[i] = strides3(strides + 15 + 3 * i);
    return for_each_pair(&c, backward_pair, threads);
}
