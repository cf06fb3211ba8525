/* A transformer block's training forward and backward in bf16, each as one call.
 *
 * fused_block.py runs a block as some twenty C calls (block_ops.c's LayerNorms, activation and
 * residual adds, tile_matmul.c's products on AMX tiles, causal_attention.c's attention) with
 * Python between them. Here the same functions run in the same order with the same threads,
 * so every value is the same bit for bit, without the Python: block_kernel.py says why and
 * when. The three files are compiled into this one.
 *
 * Shapes: x (N, C) fp32 is B sequences of T rows, N = B T; H heads of D = C / H features; the
 * projections' weights are Wqkv (3C, C), Wo (C, C), Wfc (4C, C), Wp (C, 4C) fp32. Every buffer
 * is laid out by block_kernel.py (its offsets in `offset`, in the order of the enums below). */
#include "block_ops.c"
#include "tile_matmul.c"
#include "causal_attention.c" /* (last: it defines R) */

/* the parameters, fp32, in the block's order (NULL where the block has no such bias) */
enum { LN1_W, LN1_B, QKV_W, QKV_B, O_W, O_B, LN2_W, LN2_B, FC_W, FC_B, P_W, P_B, PARAMS };

/* what the forward keeps for the backward: bf16 but mean, rstd, lse and x1 (fp32), and the
 * weights laid out for the backward's products */
enum { H1, MEAN1, RSTD1, QKV, Y, LSE, X1, H2, MEAN2, RSTD2, F, G, BWD_QKV, BWD_O, BWD_FC, BWD_P,
       KEPT };
/* the forward's own: the weights laid out for its products, the biases in bf16, the attention
 * and MLP branches' outputs */
enum { FWD_QKV = KEPT, FWD_O, FWD_FC, FWD_P, B_QKV, B_O, B_FC, B_P, O, P, FORWARD_BUFFERS };
/* the backward's own: the gradients of d_out (rounded), g, f, h2, x1 (fp32 and rounded), y,
 * qkv, h1, and the weight gradients' scratch */
enum { D16 = KEPT, DG, DF, DH2, DX1, DX1_16, DY, DQKV, DH1, WG, BACKWARD_BUFFERS };

typedef struct {
    long B, T, C, H, N, D;
    long qkv[3], y[3]; /* the attention's (sequence, head, time) strides of q, k, v and y */
} Dims;

static Dims dims_of(const long *shape) {
    long B = shape[0], T = shape[1], C = shape[2], H = shape[3];
    return (Dims){B, T, C, H, B * T, C / H, {T * 3 * C, C / H, 3 * C}, {T * C, C / H, C}};
}

/* buffer i at its offset in the kept buffers (i < KEPT) or in the call's own */
static void place(void **b, int count, uint8_t *kept, uint8_t *own, const long *offset) {
    for (int i = 0; i < count; i++) b[i] = (i < KEPT ? kept : own) + offset[i];
}

/* the weight gradient dy^T x (tile_matmul.py's weight_grad) of contiguous dy (M, n_out) and x
 * (M, n_in) */
static void weight_grad(long M, long n_out, long n_in, const void *dy, const void *x, float *dw,
                        void *scratch, int threads) {
    tile_weight_grad(M, n_out, n_in, dy, n_out, x, n_in, dw, scratch, threads);
}

/* out (N, C) fp32 = the block of x (fused_block.py's docstring), its products on tiles; eps:
 * the two LayerNorms'; act: the activation of every bf16 value (block_ops.py's table); cos and
 * sin: rotary tables (T, D/2), or NULL. Returns 0, or 1 when the attention had no memory. */
int block_forward(const long *shape, const float *eps, const float *act, const float *cos,
                  const float *sin, const float *x, const float *const *param, uint8_t *kept,
                  uint8_t *own, const long *offset, float *out, int threads) {
    Dims d = dims_of(shape);
    long C = d.C, N = d.N;
    void *b[FORWARD_BUFFERS];
    place(b, FORWARD_BUFFERS, kept, own, offset);
    const float *W[4] = {param[QKV_W], param[O_W], param[FC_W], param[P_W]};
    long n[4] = {3 * C, C, 4 * C, C}, k[4] = {C, C, C, 4 * C};
    uint16_t *fwd[4] = {b[FWD_QKV], b[FWD_O], b[FWD_FC], b[FWD_P]};
    uint16_t *bwd[4] = {b[BWD_QKV], b[BWD_O], b[BWD_FC], b[BWD_P]};
    pack_weights(4, W, n, k, fwd, bwd, threads);
    const void *bias_src[4];
    void *bias_dst[4];
    long bias_n[4];
    uint16_t *bias[4] = {0};
    const int of[4] = {QKV_B, O_B, FC_B, P_B};
    int biases = 0;
    for (int i = 0; i < 4; i++)
        if (param[of[i]]) { /* the biases there are, rounded in one call */
            bias[i] = b[B_QKV + i];
            bias_src[biases] = param[of[i]], bias_dst[biases] = bias[i], bias_n[biases++] = n[i];
        }
    if (biases) convert_many(biases, bias_src, bias_dst, bias_n, 1, threads);
    ln_forward(N, C, x, NULL, NULL, param[LN1_W], param[LN1_B], eps[0], b[H1], b[MEAN1], b[RSTD1], 1, threads);
    tile_product(N, 3 * C, C, b[H1], C, fwd[0], bias[0], b[QKV], threads);
    const uint16_t *qkv = b[QKV];
    if (attention_forward(1, d.B, d.H, d.T, d.D, qkv, d.qkv, qkv + C, d.qkv, qkv + 2 * C, d.qkv, b[Y],
                          d.y, b[LSE], cos, sin, threads))
        return 1;
    tile_product(N, C, C, b[Y], C, fwd[1], bias[1], b[O], threads);
    /* x1 = x + o, the residual stream in fp32, and h2 = LN2(x1) */
    ln_forward(N, C, x, b[O], b[X1], param[LN2_W], param[LN2_B], eps[1], b[H2], b[MEAN2], b[RSTD2], 1, threads);
    tile_product(N, 4 * C, C, b[H2], C, fwd[2], bias[2], b[F], threads);
    act_forward(N * 4 * C, act, b[F], b[G], threads);
    tile_product(N, C, 4 * C, b[G], 4 * C, fwd[3], bias[3], b[P], threads);
    residual_add(N * C, b[X1], b[P], out, 1, threads);
    return 0;
}

/* dx (N, C) fp32 and the parameters' gradients (grad, in param's order; NULL: not wanted, as
 * the projections' biases', which block_kernel.py sums from the buffers D16, DF, DX1_16 and
 * DQKV) from d_out (N, C) fp32 and what block_forward kept; act_grad: the activation's
 * derivative at every bf16 value. Returns 0, or 1 when a kernel had no memory. */
int block_backward(const long *shape, const float *act_grad, const float *cos, const float *sin,
                   const float *x, const float *d_out, const float *const *param, uint8_t *kept,
                   uint8_t *own, const long *offset, float *dx, float *const *grad, int threads) {
    Dims d = dims_of(shape);
    long C = d.C, N = d.N, NC = N * C;
    void *b[BACKWARD_BUFFERS];
    place(b, BACKWARD_BUFFERS, kept, own, offset);
    const void *src = d_out;
    /* MLP branch: out = x1 + g Wp^T + bp, g = act(f), f = h2 Wfc^T + bfc */
    convert_many(1, &src, &b[D16], &NC, 1, threads);
    tile_product(N, 4 * C, C, b[D16], C, b[BWD_P], NULL, b[DG], threads);
    weight_grad(N, C, 4 * C, b[D16], b[G], grad[P_W], b[WG], threads);
    act_backward(N * 4 * C, act_grad, b[DG], b[F], b[DF], threads);
    tile_product(N, C, 4 * C, b[DF], 4 * C, b[BWD_FC], NULL, b[DH2], threads);
    weight_grad(N, 4 * C, C, b[DF], b[H2], grad[FC_W], b[WG], threads);
    /* x1 reaches the output through LN2 and through the residual (d_out) */
    if (ln_backward(N, C, b[DH2], b[X1], b[MEAN2], b[RSTD2], param[LN2_W], d_out, b[DX1], b[DX1_16],
                    grad[LN2_W], grad[LN2_B], threads))
        return 1;
    /* attention branch: x1 = x + y Wo^T + bo, y = attention(h1 Wqkv^T + bqkv) */
    tile_product(N, C, C, b[DX1_16], C, b[BWD_O], NULL, b[DY], threads);
    weight_grad(N, C, C, b[DX1_16], b[Y], grad[O_W], b[WG], threads);
    const uint16_t *qkv = b[QKV];
    uint16_t *dqkv = b[DQKV];
    long st[24];
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < 3; t++) st[3 * t + i] = st[15 + 3 * t + i] = d.qkv[i];
        st[9 + i] = st[12 + i] = d.y[i];
    }
    if (attention_backward(1, d.B, d.H, d.T, d.D, qkv, qkv + C, qkv + 2 * C, b[Y], b[DY], b[LSE], dqkv,
                           dqkv + C, dqkv + 2 * C, st, cos, sin, threads))
        return 1;
    tile_product(N, C, 3 * C, b[DQKV], 3 * C, b[BWD_QKV], NULL, b[DH1], threads);
    weight_grad(N, 3 * C, C, b[DQKV], b[H1], grad[QKV_W], b[WG], threads);
    return ln_backward(N, C, b[DH1], x, b[MEAN1], b[RSTD1], param[LN1_W], b[DX1], dx, NULL,
                       grad[LN1_W], grad[LN1_B], threads);
}
