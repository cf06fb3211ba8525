/* One GPT decode step (one new token of each of B sequences) in one call, for CPUs with AVX-512.
 * Compiled on first use (scratchgpt/models/c_kernels.py) and called by
 * scratchgpt/models/native.py, which says why it exists and when it is used; the model it computes is scratchgpt.models.gpt.GPT (pre-LayerNorm blocks).
 *
 *   x = wte[token] + wpe[position]   (no wpe with rotary positions)  (C,)
 *   for each layer:
 *       x = x + skip_weight * (output of the mirror layer)          (U-net skips, if any)
 *       qkv = c_attn(ln_1(x))                                       (3C,)
 *       per head: v mixed with the value embedding of the token, q and k RMS-normalized and
 *       rotated by the position (each if the model has it); cache[slot] = k, v;
 *       a = softmax(q k^T / sqrt(D)) v                              (D,) a head, (C,) in all
 *       x = x + c_proj(a)
 *       x = x + mlp.c_proj(act(mlp.c_fc(ln_2(x))))                  (4C,) in between
 *   logits = lm_head(ln_f(x))  (soft-capped if asked)               (V,)
 *
 * Why one call: a PyTorch decode step of GPT-2 124M spends ~3 ms outside its matrix products
 * (about 150 kernel launches, module calls, allocations), 15-20% of the step; here it is a few
 * hundred microseconds. The products stream each weight row once with software prefetch, as
 * int8_matmul.c does.
 *
 * Weights: fp32, bf16 or int8 (one fp32 scale per output row; rows zero-padded to a multiple of
 * 16). fp32 and bf16 weights are multiplied in fp32 registers (bf16 widened by a shift); int8
 * products are those of int8_matmul.c, included below: the inputs rounded to bf16, the weights
 * widened to bf16 exactly, AVX512-BF16 dot products summed in fp32, as the eager int8 model
 * computes them (without AVX512-BF16 this file builds without int8, and native.py refuses int8
 * models). All activations, norms, attention and sums are fp32. The KV cache is fp32 or bf16
 * (rounded to nearest even, as torch's conversion does).
 *
 * Threads: one OpenMP parallel region for the whole step; each product splits its output rows
 * between the threads, attention splits the (sequence, head) pairs, the norms the sequences.
 * Built against the libgomp PyTorch has loaded, the region uses PyTorch's thread pool.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd16.h" /* 16-wide masked loads and stores of fp32 or bf16 */

#ifndef PREFETCH
#define PREFETCH 8192
#endif
#ifdef __AVX512BF16__
#include "int8_matmul.c" /* int8 products: the same blocks, the same sums as the eager model's */
#define HAVE_INT8 1
#else
#define HAVE_INT8 0
#endif
#define ROWS 4 /* weight rows whose sums are kept in flight together */

enum { W_F32 = 0, W_BF16 = 1, W_INT8 = 2 };
enum { ACT_GELU_TANH = 0, ACT_GELU = 1, ACT_RELU = 2, ACT_RELU2 = 3 };

/* A Linear: y[n] = scale[n] * (w[n] . x) + bias[n]; scale only for int8, bias may be NULL. */
typedef struct {
    const void *w;
    const float *scale;
    const float *bias;
    int n_out, n_in, stride; /* stride: elements from one weight row to the next */
} Linear;

typedef struct {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b; /* LayerNorm gains and biases (b may be NULL) */
    Linear attn, proj, fc, fc_proj;
    const float *q_norm, *k_norm; /* QK-norm gains (D,), or NULL */
    const void *ve;               /* value-embedding table (vocab, C), or NULL */
    int ve_bf16;
    float ve_lambda;              /* v = (1 - ve_lambda) v + ve_lambda ve[token] */
} Layer;

typedef struct {
    int n_layer, n_head, n_embd, wtype, act;
    float eps, softcap;
    const void *wte; /* (vocab, C) in the weights' dtype (int8 models: fp32) */
    int wte_bf16;
    const float *wpe;  /* (positions, C) fp32: learned or sinusoidal positions, or NULL */
    const float *rope_cos, *rope_sin; /* (positions, D / 2) rotary angles, or NULL */
    const Layer *layers;
    const float *lnf_w, *lnf_b;
    Linear head;
    int n_skip;               /* U-net skips: the last n_skip layers add the first n_skip's */
    const float *skip_weights; /* (n_skip,) */
} Model;

/* ---- loading 16 values as fp32 (mask: which of the 16 are read; the rest are 0) */

static inline __m512 load_i8(const int8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

static inline __m512 load_w(int wtype, const void *w, long i, __mmask16 m) {
    if (wtype != W_INT8) return load16(w, wtype == W_BF16, i, m);
    return load_i8((const int8_t *)w + i, m);
}

static inline float to_f32(const void *p, int bf16, long i) {
    if (!bf16) return ((const float *)p)[i];
    union { uint32_t u; float f; } v = {.u = (uint32_t)((const uint16_t *)p)[i] << 16};
    return v.f;
}

/* ---- products: sums[i][j] = w[row0 + j] . x[i] for ROWS weight rows and up to XROWS rows of
 * activations (fewer of either at the end)
 *
 * Written once, compiled once per weight type and block shape (the arguments wtype, esize, nx
 * and nw are constants where dot_block calls it, so the loads, the prefetch stride and the
 * loops are resolved at compile time). Each (activation row, weight row) pair has its own
 * chain of FMAs over k, in the same order whatever the block's shape: a row gets the same
 * bits in a batch as alone. */
#define XROWS 4
/* Unrolled early: GCC then keeps a block's sums in registers; left to its later unrolling, the
 * sums array stays in memory and every step stores all of them (a third of the FMA peak). */
#define UNROLL _Pragma("GCC unroll 4")

static inline __attribute__((always_inline)) void
dot_block_as(int wtype, int esize, const Linear *L, int row0, int nw, const float *x, int nx,
             float sums[XROWS][ROWS]) {
    const char *base = (const char *)L->w + (long)row0 * L->stride * esize;
    __m512 acc[XROWS][ROWS];
    UNROLL for (int i = 0; i < XROWS; i++)
        UNROLL for (int j = 0; j < ROWS; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < L->n_in; k += 16) {
        /* a step reads 16 elements of each of the ROWS rows, ROWS * 16 * esize bytes of the
         * block: prefetch as many bytes PREFETCH ahead, so the next rows stream in */
        const char *ahead = base + PREFETCH + (long)ROWS * k * esize;
        for (int line = 0; line < ROWS * 16 * esize; line += 64)
            _mm_prefetch(ahead + line, _MM_HINT_T0);
        __mmask16 m = tail16(k, L->n_in);
        __m512 wv[ROWS];
        UNROLL for (int j = 0; j < nw; j++)
            wv[j] = load_w(wtype, L->w, (long)(row0 + j) * L->stride + k, m);
        UNROLL for (int i = 0; i < nx; i++) {
            __m512 xv = load16(x, 0, (long)i * L->n_in + k, m);
            UNROLL for (int j = 0; j < nw; j++) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
        }
    }
    UNROLL for (int i = 0; i < nx; i++)
        UNROLL for (int j = 0; j < nw; j++) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

/* (one row, and full blocks, get their own unrolled copies) */
#define DOT_BLOCK_SHAPES(WT, ES)                                                              \
    if (nx == 1 && nw == ROWS) dot_block_as(WT, ES, L, row0, ROWS, x, 1, sums);               \
    else if (nx == XROWS && nw == ROWS) dot_block_as(WT, ES, L, row0, ROWS, x, XROWS, sums);  \
    else dot_block_as(WT, ES, L, row0, nw, x, nx, sums);

static void dot_block(int wtype, const Linear *L, int row0, int nw, const float *x, int nx,
                      float sums[XROWS][ROWS]) {
    if (wtype == W_F32) { DOT_BLOCK_SHAPES(W_F32, 4) }
    else if (wtype == W_BF16) { DOT_BLOCK_SHAPES(W_BF16, 2) }
    else { DOT_BLOCK_SHAPES(W_INT8, 1) }
}

static inline float activate(int act, float v) {
    switch (act) {
    case ACT_GELU_TANH:
        return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    case ACT_GELU:
        return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    case ACT_RELU:
        return v > 0 ? v : 0;
    default:
        return v > 0 ? v * v : 0;
    }
}

enum { OUT_SET, OUT_ADD, OUT_ACT, OUT_CAP };

/* Per-thread scratch of an int8 model's products: its copy of the activation rows in bf16, and
 * a block of weight rows widened to bf16 (for batches of I8_WIDEN_FROM rows or more). */
typedef struct {
    uint16_t *xb, *wb;
} Scratch;

#if HAVE_INT8
_Static_assert(ROWS == I8_ROWS_N && XROWS == I8_ROWS_M, "the int8 blocks are this file's blocks");
#endif

/* sums of rows [b, b + nx) with weight rows [n, n + nw): in fp32 arithmetic, or for int8
 * weights int8_matmul.c's bf16 products (on the block linear() widened, for a large batch) */
static void block_sums(const Model *M, const Linear *L, const Scratch *s, int B, int n, int nw,
                       const float *x, int b, int nx, float sums[XROWS][ROWS]) {
#if HAVE_INT8
    if (M->wtype == W_INT8) {
        i8_block(s->xb + (long)b * L->stride, L->stride, nx,
                 (const int8_t *)L->w + (long)n * L->stride, L->stride,
                 B >= I8_WIDEN_FROM ? s->wb : NULL, nw, L->stride, sums);
        return;
    }
#endif
    dot_block(M->wtype, L, n, nw, x + (long)b * L->n_in, nx, sums);
}

/* An int8 product's inputs, as the eager int8 model gives them to int8_matmul: each row rounded
 * to bf16 and zero-padded to the weights' padded width. Every thread makes its own copy (a few
 * KiB), so no thread waits for another. */
static void round_inputs(const Linear *L, int B, const float *x, const Scratch *s) {
#if HAVE_INT8
    for (int b = 0; b < B; b++)
        i8_round_row(x + (long)b * L->n_in, L->n_in, L->stride, s->xb + (long)b * L->stride);
#else
    (void)L, (void)B, (void)x, (void)s;
#endif
}

/* y = L(x) for B rows (x: (B, n_in), y: (B, n_out)), split over the threads by blocks of ROWS
 * weight rows; then per output: OUT_SET y = v, OUT_ADD y += v (a residual), OUT_ACT y = act(v),
 * OUT_CAP y = cap * tanh(v / cap). Each block of weight rows is read once for XROWS rows of x,
 * from memory for the first XROWS and from cache for the next, and every row is summed as if it
 * were alone (the same bits). Called by every thread of the region; ends with its barrier. */
static void linear(const Model *M, const Linear *L, int B, const float *x, float *y, int out,
                   float arg, const Scratch *s) {
    int blocks = (L->n_out + ROWS - 1) / ROWS;
    if (M->wtype == W_INT8) round_inputs(L, B, x, s);
#pragma omp for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int n = blk * ROWS, nw = L->n_out - n < ROWS ? L->n_out - n : ROWS;
#if HAVE_INT8
        if (M->wtype == W_INT8 && B >= I8_WIDEN_FROM)
            i8_widen_rows((const int8_t *)L->w + (long)n * L->stride, L->stride, nw, L->stride,
                          s->wb);
#endif
        for (int b = 0; b < B; b += XROWS) {
            int nx = B - b < XROWS ? B - b : XROWS;
            float sums[XROWS][ROWS];
            block_sums(M, L, s, B, n, nw, x, b, nx, sums);
            for (int i = 0; i < nx; i++) {
                float *yb = y + (long)(b + i) * L->n_out + n;
                for (int j = 0; j < nw; j++) {
                    float v = L->scale ? sums[i][j] * L->scale[n + j] : sums[i][j];
                    if (L->bias) v += L->bias[n + j];
                    if (out == OUT_SET) yb[j] = v;
                    else if (out == OUT_ADD) yb[j] += v;
                    else if (out == OUT_ACT) yb[j] = activate(M->act, v);
                    else yb[j] = arg * tanhf(v / arg);
                }
            }
        }
    }
}

/* 1 where this build has int8 products (they need AVX512-BF16), else 0 */
int gpt_decode_int8(void) { return HAVE_INT8; }

/* ---- the small vector work */

static void layer_norm(const float *x, const float *w, const float *b, float eps, int n,
                       float *y) {
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    float inv = 1.0f / sqrtf((float)(var / n) + eps), mu = (float)mean;
    for (int i = 0; i < n; i++) y[i] = (x[i] - mu) * inv * w[i] + (b ? b[i] : 0.0f);
}

static float dot_f32(const float *a, const void *b, int b_bf16, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int k = 0; k < n; k += 16) {
        __mmask16 m = tail16(k, n);
        acc = _mm512_fmadd_ps(load16(a, 0, k, m), load16(b, b_bf16, k, m), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static void rms_norm(float *x, const float *w, float eps, int n) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / n + eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * inv * w[i];
}

static void rotate(float *x, const float *cos, const float *sin, int D) {
    for (int i = 0; i < D / 2; i++) { /* the pair (x[i], x[i + D/2]) turns by angle i */
        float a = x[i], b = x[i + D / 2];
        x[i] = a * cos[i] - b * sin[i];
        x[i + D / 2] = a * sin[i] + b * cos[i];
    }
}

/* This head's q, k, v (D,) each, in qkv, with the layer's options applied, in the model's
 * order: value embedding, QK-norm, rotation. */
static void head_options(const Model *M, const Layer *L, float *q, float *k, float *v,
                         int h, int token, int position) {
    int C = M->n_embd, D = C / M->n_head;
    if (L->ve)
        for (int d = 0; d < D; d++)
            v[d] = (1 - L->ve_lambda) * v[d]
                   + L->ve_lambda * to_f32(L->ve, L->ve_bf16, (long)token * C + h * D + d);
    if (L->q_norm) {
        rms_norm(q, L->q_norm, M->eps, D);
        rms_norm(k, L->k_norm, M->eps, D);
    }
    if (M->rope_cos) {
        const float *cos = M->rope_cos + (long)position * (D / 2);
        const float *sin = M->rope_sin + (long)position * (D / 2);
        rotate(q, cos, sin, D);
        rotate(k, cos, sin, D);
    }
}

/* One head of one layer: write its key and value at `slot`, attend over slots first..slot.
 * qkv: (3C,) of this token (this head's part is changed in place by the layer's options);
 * kc, vc: the layer's (H, max_len, D) cache; out: (D,); scores: (max_len,) scratch. */
static void attend_head(const Model *M, const Layer *L, int h, float *qkv, void *kc, void *vc,
                        int bf, int max_len, int first, int slot, int token, int position,
                        float *scores, float *out) {
    int C = M->n_embd, D = C / M->n_head;
    long row0 = (long)h * max_len * D; /* element index of this head's slot 0 */
    float *q = qkv + h * D;
    head_options(M, L, q, qkv + C + h * D, qkv + 2 * C + h * D, h, token, position);
    store_row(kc, bf, row0 + (long)slot * D, qkv + C + h * D, 1.0f, D);
    store_row(vc, bf, row0 + (long)slot * D, qkv + 2 * C + h * D, 1.0f, D);
    float scale = 1.0f / sqrtf((float)D), top = -INFINITY, total = 0;
    int esize = bf ? 2 : 4;
    for (int t = first; t <= slot; t++) {
        const char *kt = (const char *)kc + (row0 + (long)t * D) * esize;
        scores[t] = dot_f32(q, kt, bf, D) * scale;
        if (scores[t] > top) top = scores[t];
    }
    for (int t = first; t <= slot; t++) total += scores[t] = expf(scores[t] - top);
    for (int d = 0; d < D; d++) out[d] = 0;
    for (int t = first; t <= slot; t++) {
        float p = scores[t] / total;
        for (int d = 0; d < D; d += 16) {
            __mmask16 m = tail16(d, D);
            __m512 vv = load16(vc, bf, row0 + (long)t * D + d, m);
            __m512 o = _mm512_fmadd_ps(_mm512_set1_ps(p), vv, load16(out, 0, d, m));
            _mm512_mask_storeu_ps(out + d, m, o);
        }
    }
}

/* What one call decodes: B rows, each one new token, all going into cache slot `slot` (rows
 * of different lengths are left-padded, so their newest tokens share a slot). */
typedef struct {
    int B, slot, max_len, cache_bf16;
    const int *tokens, *positions, *firsts; /* (B,) ids, position ids, first real slots */
    void *kc, *vc; /* keys and values (n_layer, B, H, max_len, D), fp32 or bf16 */
} Step;

/* Row b's x gets the output saved by the mirror layer of `mirror` (U-net skips), then its
 * LayerNorm goes to h. */
static void norm_rows(const Model *M, const Step *S, int mirror, float *x, float *h,
                      const float *saved, const float *w, const float *bias) {
    int C = M->n_embd;
#pragma omp for schedule(static)
    for (int b = 0; b < S->B; b++) {
        float *xb = x + (long)b * C;
        if (mirror >= 0) { /* the first saved output is the last one added */
            const float *s = saved + ((long)b * M->n_skip + M->n_skip - 1 - mirror) * C;
            for (int i = 0; i < C; i++) xb[i] += M->skip_weights[mirror] * s[i];
        }
        layer_norm(xb, w, bias, M->eps, C, h + (long)b * C);
    }
}

/* One layer's attention for every row and head: qkv (B, 3C) -> att (B, C). */
static void attend(const Model *M, const Layer *L, const Step *S, int l, float *qkv,
                   float *att, float *scores) {
    int C = M->n_embd, H = M->n_head, D = C / H, esize = S->cache_bf16 ? 2 : 4;
    long row_elems = (long)H * S->max_len * D; /* one row's cache in one layer */
#pragma omp for schedule(static)
    for (int bh = 0; bh < S->B * H; bh++) {
        int b = bh / H, hd = bh % H;
        long offset = ((long)l * S->B + b) * row_elems * esize;
        attend_head(M, L, hd, qkv + (long)b * 3 * C, (char *)S->kc + offset,
                    (char *)S->vc + offset, S->cache_bf16, S->max_len, S->firsts[b], S->slot,
                    S->tokens[b], S->positions[b], scores + (long)bh * S->max_len,
                    att + (long)b * C + hd * D);
    }
}

/* This thread's scratch for an int8 model's products (NULLs for other weights): inputs of up
 * to 4C + 16 (padded) per row, and four widened weight rows of as many. */
static Scratch scratch(const Model *M, int B) {
    Scratch s = {NULL, NULL};
    if (M->wtype != W_INT8) return s;
    long width = 4L * M->n_embd + 32;
    s.xb = malloc((size_t)B * width * sizeof(uint16_t));
    s.wb = aligned_alloc(64, (size_t)ROWS * ((width + 31) & ~31L) * sizeof(uint16_t));
    if (!s.xb || !s.wb) abort();
    return s;
}

/* The step: logits (B, V) of the next tokens. work: scratch of (10 + n_skip) B C +
 * B H max_len floats. */
void gpt_decode_step(const Model *M, const Step *S, float *work, float *logits, int threads) {
    int C = M->n_embd, B = S->B;
    float *x = work, *h = x + (long)B * C, *qkv = h + (long)B * C, *att = qkv + 3L * B * C;
    float *mlp = att + (long)B * C, *scores = mlp + 4L * B * C;  /* scores: (B, H, max_len) */
    float *saved = scores + (long)B * M->n_head * S->max_len;   /* (B, n_skip, C) */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < C; i++)
            x[(long)b * C + i] = to_f32(M->wte, M->wte_bf16, (long)S->tokens[b] * C + i)
                                 + (M->wpe ? M->wpe[(long)S->positions[b] * C + i] : 0.0f);
#pragma omp parallel num_threads(threads)
    {
        Scratch s = scratch(M, B);
        for (int l = 0; l < M->n_layer; l++) {
            const Layer *L = &M->layers[l];
            norm_rows(M, S, l - (M->n_layer - M->n_skip), x, h, saved, L->ln1_w, L->ln1_b);
            linear(M, &L->attn, B, h, qkv, OUT_SET, 0, &s);
            attend(M, L, S, l, qkv, att, scores);
            linear(M, &L->proj, B, att, x, OUT_ADD, 0, &s);
            norm_rows(M, S, -1, x, h, saved, L->ln2_w, L->ln2_b);
            linear(M, &L->fc, B, h, mlp, OUT_ACT, 0, &s);
            linear(M, &L->fc_proj, B, mlp, x, OUT_ADD, 0, &s);
            if (l < M->n_skip) {
#pragma omp for schedule(static)
                for (int b = 0; b < B; b++)
                    for (int i = 0; i < C; i++)
                        saved[((long)b * M->n_skip + l) * C + i] = x[(long)b * C + i];
            }
        }
        norm_rows(M, S, -1, x, h, saved, M->lnf_w, M->lnf_b);
        linear(M, &M->head, B, h, logits, M->softcap > 0 ? OUT_CAP : OUT_SET, M->softcap, &s);
        free(s.xb), free(s.wb);
    }
}
