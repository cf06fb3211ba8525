/* One GPT decode step (one new token of one sequence) in one call, for CPUs with AVX-512.
 * Compiled on first use by scratchgpt/models/native.py, which says why it exists and when it
 * is used; the model it computes is scratchgpt.models.gpt.GPT (pre-LayerNorm blocks).
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
 * 16), always multiplied in fp32 registers: bf16 is widened by a shift, int8 by a convert. All
 * activations, norms, attention and sums are fp32. The KV cache is fp32 or bf16 (rounded to
 * nearest even, as torch's conversion does).
 *
 * Threads: one OpenMP parallel region for the whole step; each product splits its output rows
 * between the threads, attention splits the heads; the small vector work between them (norms,
 * the embedding) runs on one thread. Built against the libgomp PyTorch has loaded, the region
 * uses PyTorch's thread pool.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#ifndef PREFETCH
#define PREFETCH 8192
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
    int n_layer, n_head, n_embd, vocab, wtype, act;
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

static inline __m512 load_f32(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512 load_i8(const int8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

static inline __m512 load_w(int wtype, const void *w, long i, __mmask16 m) {
    if (wtype == W_F32) return load_f32((const float *)w + i, m);
    if (wtype == W_BF16) return load_bf16((const uint16_t *)w + i, m);
    return load_i8((const int8_t *)w + i, m);
}

static inline __mmask16 tail(int k, int n) { return n - k >= 16 ? 0xFFFF : (__mmask16)((1u << (n - k)) - 1); }

static inline float to_f32(const void *p, int bf16, long i) {
    if (!bf16) return ((const float *)p)[i];
    union { uint32_t u; float f; } v = {.u = (uint32_t)((const uint16_t *)p)[i] << 16};
    return v.f;
}

static inline uint16_t bf16_round(float f) { /* round to nearest even (NaN stays NaN) */
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7FFF + ((v.u >> 16) & 1)) >> 16);
}

/* ---- products: sums[j] = w[row0 + j] . x for ROWS rows (fewer at the end)
 *
 * Written once, compiled once per weight type (wtype is a constant at each call of
 * dot_rows_as, so the loads and the prefetch stride are resolved at compile time). */

static inline __attribute__((always_inline)) void
dot_rows_as(int wtype, int esize, const Linear *L, int row0, int nw, const float *x,
            float sums[ROWS]) {
    const char *base = (const char *)L->w + (long)row0 * L->stride * esize;
    __m512 acc[ROWS];
    for (int j = 0; j < ROWS; j++) acc[j] = _mm512_setzero_ps();
    for (int k = 0; k < L->n_in; k += 16) {
        /* a step reads 16 elements of each of the ROWS rows, ROWS * 16 * esize bytes of the
         * block: prefetch as many bytes PREFETCH ahead, so the next rows stream in */
        const char *ahead = base + PREFETCH + (long)ROWS * k * esize;
        for (int line = 0; line < ROWS * 16 * esize; line += 64)
            _mm_prefetch(ahead + line, _MM_HINT_T0);
        __mmask16 m = tail(k, L->n_in);
        __m512 xv = load_f32(x + k, m);
        for (int j = 0; j < nw; j++)
            acc[j] = _mm512_fmadd_ps(load_w(wtype, L->w, (long)(row0 + j) * L->stride + k, m),
                                     xv, acc[j]);
    }
    for (int j = 0; j < nw; j++) sums[j] = _mm512_reduce_add_ps(acc[j]);
}

static void dot_rows(int wtype, const Linear *L, int row0, int nw, const float *x,
                     float sums[ROWS]) {
    /* (full blocks get their own copy, with the rows loop unrolled) */
    if (wtype == W_F32 && nw == ROWS) dot_rows_as(W_F32, 4, L, row0, ROWS, x, sums);
    else if (wtype == W_F32) dot_rows_as(W_F32, 4, L, row0, nw, x, sums);
    else if (wtype == W_BF16 && nw == ROWS) dot_rows_as(W_BF16, 2, L, row0, ROWS, x, sums);
    else if (wtype == W_BF16) dot_rows_as(W_BF16, 2, L, row0, nw, x, sums);
    else if (nw == ROWS) dot_rows_as(W_INT8, 1, L, row0, ROWS, x, sums);
    else dot_rows_as(W_INT8, 1, L, row0, nw, x, sums);
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

/* y = L(x), split over the threads by blocks of ROWS rows; then per output: OUT_SET y = v,
 * OUT_ADD y += v (a residual), OUT_ACT y = act(v), OUT_CAP y = cap * tanh(v / cap). Called by
 * every thread of the region; ends with its barrier. */
static void linear(const Model *M, const Linear *L, const float *x, float *y, int out,
                   float arg) {
    int blocks = (L->n_out + ROWS - 1) / ROWS;
#pragma omp for schedule(static)
    for (int b = 0; b < blocks; b++) {
        int n = b * ROWS, nw = L->n_out - n < ROWS ? L->n_out - n : ROWS;
        float sums[ROWS];
        dot_rows(M->wtype, L, n, nw, x, sums);
        for (int j = 0; j < nw; j++) {
            float v = L->scale ? sums[j] * L->scale[n + j] : sums[j];
            if (L->bias) v += L->bias[n + j];
            if (out == OUT_SET) y[n + j] = v;
            else if (out == OUT_ADD) y[n + j] += v;
            else if (out == OUT_ACT) y[n + j] = activate(M->act, v);
            else y[n + j] = arg * tanhf(v / arg);
        }
    }
}

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
        __mmask16 m = tail(k, n);
        __m512 bv = b_bf16 ? load_bf16((const uint16_t *)b + k, m) : load_f32((const float *)b + k, m);
        acc = _mm512_fmadd_ps(load_f32(a + k, m), bv, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static void store_row(void *dst, int bf16, long i, const float *src, int n) {
    for (int d = 0; d < n; d++) {
        if (bf16) ((uint16_t *)dst)[i + d] = bf16_round(src[d]);
        else ((float *)dst)[i + d] = src[d];
    }
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
    store_row(kc, bf, row0 + (long)slot * D, qkv + C + h * D, D);
    store_row(vc, bf, row0 + (long)slot * D, qkv + 2 * C + h * D, D);
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
            __mmask16 m = tail(d, D);
            const char *vt = (const char *)vc + (row0 + (long)t * D + d) * esize;
            __m512 vv = bf ? load_bf16((const uint16_t *)vt, m) : load_f32((const float *)vt, m);
            __m512 o = _mm512_fmadd_ps(_mm512_set1_ps(p), vv, load_f32(out + d, m));
            _mm512_mask_storeu_ps(out + d, m, o);
        }
    }
}

/* The step. kc, vc: the cache's keys and values, (n_layer, H, max_len, D) (one sequence),
 * fp32 or (cache_bf16) bf16; first: the first slot holding a real token (left padding before it); slot: where this token
 * goes; position: its position id. work: (10 + n_skip) C + H * max_len floats of scratch.
 * logits: (V,). */
void gpt_decode_step(const Model *M, int token, int position, void *kc, void *vc,
                     int max_len, int first, int slot, float *work, float *logits, int threads,
                     int cache_bf16) {
    int C = M->n_embd, H = M->n_head;
    float *x = work, *h = x + C, *qkv = h + C, *att = qkv + 3 * C, *mlp = att + C;
    float *scores = mlp + 4 * C;           /* (H, max_len) */
    float *saved = scores + (long)H * max_len; /* (n_skip, C): outputs of the first layers */
    long layer_elems = (long)H * max_len * (C / H);
    int esize = cache_bf16 ? 2 : 4;
    for (int i = 0; i < C; i++)
        x[i] = to_f32(M->wte, M->wte_bf16, (long)token * C + i)
               + (M->wpe ? M->wpe[(long)position * C + i] : 0.0f);
#pragma omp parallel num_threads(threads)
    {
        for (int l = 0; l < M->n_layer; l++) {
            const Layer *L = &M->layers[l];
            void *kl = (char *)kc + l * layer_elems * esize, *vl = (char *)vc + l * layer_elems * esize;
            int mirror = l - (M->n_layer - M->n_skip); /* >= 0: a layer that gets a skip */
#pragma omp single
            {
                if (mirror >= 0) /* the first saved output is the last one added */
                    for (int i = 0; i < C; i++)
                        x[i] += M->skip_weights[mirror] * saved[(long)(M->n_skip - 1 - mirror) * C + i];
                layer_norm(x, L->ln1_w, L->ln1_b, M->eps, C, h);
            }
            linear(M, &L->attn, h, qkv, OUT_SET, 0);
#pragma omp for schedule(static)
            for (int hd = 0; hd < H; hd++)
                attend_head(M, L, hd, qkv, kl, vl, cache_bf16, max_len, first, slot, token,
                            position, scores + (long)hd * max_len, att + hd * (C / H));
            linear(M, &L->proj, att, x, OUT_ADD, 0);
#pragma omp single
            layer_norm(x, L->ln2_w, L->ln2_b, M->eps, C, h);
            linear(M, &L->fc, h, mlp, OUT_ACT, 0);
            linear(M, &L->fc_proj, mlp, x, OUT_ADD, 0);
            if (l < M->n_skip) {
#pragma omp single
                for (int i = 0; i < C; i++) saved[(long)l * C + i] = x[i];
            }
        }
#pragma omp single
        layer_norm(x, M->lnf_w, M->lnf_b, M->eps, C, h);
        linear(M, &M->head, h, logits, M->softcap > 0 ? OUT_CAP : OUT_SET, M->softcap);
    }
}
