/* A training block's bf16 products on Intel AMX tiles (tile_matmul.py says why and when).
 *
 * A tile product multiplies a 16 x 32 bf16 tile A by a 32 x 16 tile B into a 16 x 16 fp32 sum.
 * B is read as 16 rows of 16 pairs: row p holds, for each of its 16 columns, the pair of values
 * at reduction indices 2p and 2p + 1 (the "VNNI" layout). A weight is put in that layout once a
 * step, as it is rounded to bf16, for each of the two products that read it:
 *
 *   forward  y (M, N)  = x (M, K)  W^T      B = W^T: pair p of column n is W[n][2p], W[n][2p+1]
 *   backward dx (M, K) = dy (M, N) W        B = W:   pair p of column k is W[2p][k], W[2p+1][k]
 *
 * stored as blocks of 16 columns, each block all its pairs in order, so the tile for columns
 * 16 c .. 16 c + 15 and reduction indices r .. r + 31 is 16 rows of 64 bytes at
 * packed + (c * depth + r) * 16 (depth: the reduction's length).
 *
 * The weight's gradient dW (N, K) = dy^T x sums over the M rows: its A is dy^T, laid out at each
 * call (pairs of dy's rows, transposed), and its B is x in pairs of rows.
 *
 * Each 32 x 32 block of a result is four 16 x 16 tiles summed over the reduction in steps of
 * 32 (as oneDNN's own AMX kernel orders them, so the sums are PyTorch's bit for bit), then
 * rounded to bf16 (plus the bias, in fp32, before rounding, as PyTorch's addmm does; the weight
 * gradient's rounded sums widened to fp32). Every dimension a multiple of 32.
 *
 * On a CPU with AVX512-BF16 but no tiles (AMD's Zen 4), or when asked to (products_ready(0)),
 * the same layouts are read by the dot-product instruction instead: for each pair of reduction
 * indices in order, a row's broadcast pair times a row of B's 16 pairs, added into 16 fp32
 * sums, as oneDNN's kernel for such CPUs sums a forward product or an input gradient (the
 * same bits as PyTorch's there; a tile sums 32 indices at a time, in its own order). The weight
 * gradient sums its rows in that order too, where oneDNN's differs: a few of its elements in
 * ten thousand round differently. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shares.h"
#include "simd16.h"

#if defined(__AVX512BF16__)

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define HAVE_TILES 1
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#endif

static int tiles_on; /* set once by products_ready: the tiles, or the dot-product instruction */

/* The products this library computes with: 2 the tiles (where the CPU has them, `tiles` is 1
 * and Linux lets this process use their registers: their state is large, so a process asks
 * first; PyTorch's oneDNN asks too), 1 the dot-product instruction */
int products_ready(int tiles) {
#ifdef HAVE_TILES
    tiles_on = tiles && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
    return tiles_on ? 2 : 1;
}

#ifdef HAVE_TILES

/* Palette 1, eight tiles of 16 rows of 64 bytes: 0-3 the sums, 4-5 rows of x, 6-7 of B */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config;

static void configure_tiles(void) {
    static const tile_config config = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64},
                                       {16, 16, 16, 16, 16, 16, 16, 16}};
    _tile_loadconfig(&config);
}
#endif

/* 32 consecutive fp32 values rounded to bf16: 16 pairs, pair j = values 2j and 2j + 1 */
static inline __m512i row_pairs(const float *w) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(round_bf16(_mm512_loadu_ps(w))),
                              round_bf16(_mm512_loadu_ps(w + 16)), 1);
}

/* The _mm512_permutex2var_epi16 index that interleaves two rows of bf16 values (a and b, 32
 * each), 16 columns from 16 h: word 2 j is a's column 16 h + j, word 2 j + 1 b's */
static inline __m512i pair_index(int h) {
    uint16_t words[32];
    for (int j = 0; j < 16; j++) words[2 * j] = 16 * h + j, words[2 * j + 1] = 32 + 16 * h + j;
    return _mm512_loadu_si512(words);
}

/* W (N, K) fp32 in both layouts (header), fwd for x W^T and bwd for dy W (each N K bf16), from
 * one read of W, each value rounded once: 16 of its rows by 32 of its columns at a time */
static void pack_one(const float *W, long N, long K, uint32_t *fwd, uint32_t *bwd) {
    __m512i half[2] = {pair_index(0), pair_index(1)};
#pragma omp for schedule(static) nowait
    for (long c = 0; c < N / 16; c++)
        for (long k = 0; k < K; k += 32) {
            __m512i rows[16], r[16];  /* the 16 rows' 32 columns in bf16 */
            for (int j = 0; j < 16; j++) r[j] = rows[j] = row_pairs(W + (c * 16 + j) * K + k);
            transpose16(r);  /* forward: pair p of the columns of row j -> pair j of column p */
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(fwd + (c * (K / 2) + k / 2 + p) * 16, r[p]);
            for (int i = 0; i < 8; i++)  /* backward: rows 2 i and 2 i + 1 interleaved */
                for (int h = 0; h < 2; h++)
                    _mm512_storeu_si512(bwd + ((k / 16 + h) * (N / 2) + c * 8 + i) * 16,
                                        _mm512_permutex2var_epi16(rows[2 * i], half[h], rows[2 * i + 1]));
        }
}

/* count weights W[i] (n[i], k[i]) fp32 -> fwd[i], bwd[i] bf16 in tile layouts */
void pack_weights(int count, const float *const *W, const long *n, const long *k,
                  uint16_t *const *fwd, uint16_t *const *bwd, int threads) {
#pragma omp parallel num_threads(threads)
    for (int i = 0; i < count; i++)
        pack_one(W[i], n[i], k[i], (uint32_t *)fwd[i], (uint32_t *)bwd[i]);
}

/* a 32 x 32 block of sums (buf, rows of 32) + bias (bf16, or NULL) -> bf16 rows of C, rounded
 * by the processor's own instruction, as oneDNN's kernel rounds its sums */
static void store_block(const float *buf, const uint16_t *bias, uint16_t *C, long ldc) {
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (bias) {
        b0 = load16(bias, 1, 0, 0xFFFF);
        b1 = load16(bias, 1, 16, 0xFFFF);
    }
    for (int r = 0; r < 32; r++)
        _mm512_storeu_si512(C + r * ldc,
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_add_ps(_mm512_load_ps(buf + r * 32 + 16), b1),
                                                         _mm512_add_ps(_mm512_load_ps(buf + r * 32), b0)));
}

#ifdef HAVE_TILES
/* The four 16 x 16 tiles of a 32 x 32 block summed over depth (a multiple of 32): rows a and
 * a + 16 lda of A (rows lda apart) times columns b and b + 16 depth of a packed B; the sums
 * stored in buf (32 rows of 32) */
static inline void sum_block(const uint16_t *a, long lda, const uint16_t *b, long depth,
                             float *buf) {
    const uint16_t *a1 = a + 16 * lda, *b1 = b + 16 * depth;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (long r = 0; r < depth; r += 32) { /* the four loads first: 9% faster at depth 128 */
        _tile_loadd(4, a + r, lda * 2);
        _tile_loadd(6, b + r * 16, 64);
        _tile_loadd(7, b1 + r * 16, 64);
        _tile_loadd(5, a1 + r, lda * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, buf, 128);
    _tile_stored(1, buf + 16, 128);
    _tile_stored(2, buf + 16 * 32, 128);
    _tile_stored(3, buf + 16 * 32 + 16, 128);
}
#endif

/* sum_block's sums with the dot-product instruction: eight rows at a time, each pair of
 * reduction indices in order (a row's pair broadcast, times B's row of 16 pairs) */
static void dot_block(const uint16_t *a, long lda, const uint16_t *b, long depth, float *buf) {
    const uint16_t *b1 = b + 16 * depth;
    for (int r0 = 0; r0 < 32; r0 += 8) {
        __m512 sum[8][2];
        for (int r = 0; r < 8; r++) sum[r][0] = sum[r][1] = _mm512_setzero_ps();
        for (long p = 0; p < depth / 2; p++) {
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(b + p * 32);
            __m512bh w1 = (__m512bh)_mm512_loadu_si512(b1 + p * 32);
            for (int r = 0; r < 8; r++) {
                __m512bh x = (__m512bh)_mm512_set1_epi32(*(const int32_t *)(a + (r0 + r) * lda + 2 * p));
                sum[r][0] = _mm512_dpbf16_ps(sum[r][0], x, w0);
                sum[r][1] = _mm512_dpbf16_ps(sum[r][1], x, w1);
            }
        }
        for (int r = 0; r < 8; r++) {
            _mm512_store_ps(buf + (r0 + r) * 32, sum[r][0]);
            _mm512_store_ps(buf + (r0 + r) * 32 + 16, sum[r][1]);
        }
    }
}

/* a 32 x 32 block's sums into buf, on the tiles or by dot products (products_ready); begin and
 * end bracket a thread's blocks (the tiles' configuration, and their release) */
static inline void sums(const uint16_t *a, long lda, const uint16_t *b, long depth, float *buf) {
#ifdef HAVE_TILES
    if (tiles_on) {
        sum_block(a, lda, b, depth, buf);
        return;
    }
#endif
    dot_block(a, lda, b, depth, buf);
}

static void begin(void) {
#ifdef HAVE_TILES
    if (tiles_on) configure_tiles();
#endif
}

static void end(void) {
#ifdef HAVE_TILES
    if (tiles_on) _tile_release();
#endif
}

/* C (M, N) bf16 = A (M, K) bf16, rows lda apart, times B (K, N) packed (header) (+ bias (N)):
 * each thread takes stripes of 32 rows of A (shares.h) */
void tile_product(long M, long N, long K, const uint16_t *A, long lda, const uint16_t *B,
                  const uint16_t *bias, uint16_t *C, int threads) {
    Shares sh;
#pragma omp parallel num_threads(threads)
    {
        float buf[32 * 32] __attribute__((aligned(64)));
        int t = shares_begin(&sh, M / 32);
        begin();
        for (long m; (m = take(&sh, t)) >= 0;)
            for (long c = 0; c < N / 32; c++) {
                sums(A + m * 32 * lda, lda, B + c * 32 * K, K, buf);
                store_block(buf, bias ? bias + c * 32 : 0, C + m * 32 * N + c * 32, N);
            }
        end();
    }
}

/* rows r and r + 1 of a bf16 matrix (ld apart), 16 columns from c: pair j is (row r, row r + 1)
 * of column c + j (idx: pair_index(0)) */
static inline __m512i row_pair(const uint16_t *m, long ld, long r, long c, __m512i idx) {
    return _mm512_permutex2var_epi16(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(m + r * ld + c))), idx,
                                     _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(m + (r + 1) * ld + c))));
}

/* dW (N, K) fp32 = dy (M, N)^T x (M, K), both bf16 (rows ldy and ldx apart): the bf16 product's
 * rounded sums, widened. The threads (`threads` at most, and one per 32 of dW's longer side)
 * share that side in runs of 32-wide blocks (shares.h), and each first lays out what its own
 * run reads: the columns of dy as rows of dy^T (pairs of dy's rows, transposed 16 x 16), and x
 * in pairs of rows; a block taken from another's run reads that thread's layout. Scratch, M
 * (max(N, K) + threads min(N, K)) bf16: the shared side's layout, its parts each laid out by
 * the thread whose run they are in, then each thread's own copy of the other's. */
void tile_weight_grad(long M, long N, long K, const uint16_t *dy, long ldy, const uint16_t *x,
                      long ldx, float *dw, uint16_t *scratch, int threads) {
    __m512i idx = pair_index(0);
    long most = (N > K ? N : K) / 32;
    if (threads > most) threads = (int)most;
    Shares sh;
#pragma omp parallel num_threads(threads)
    {
        int t = shares_begin(&sh, most);
        long n0 = 0, n1 = N, k0 = 0, k1 = K, lo, hi, own = t * M;
        uint16_t *dyt = scratch, *xp = scratch;
        own_run(&sh, t, &lo, &hi); /* (in 32-wide blocks of the longer side) */
        if (N >= K) {
            n0 = lo * 32, n1 = hi * 32;
            xp += M * N + own * K;
        } else {
            k0 = lo * 32, k1 = hi * 32;
            dyt += M * K + own * N;
        }
        for (long n = n0; n < n1; n += 16)
            for (long m = 0; m < M; m += 32) {
                __m512i r[16];
                for (int p = 0; p < 16; p++) r[p] = row_pair(dy, ldy, m + 2 * p, n, idx);
                transpose16(r);  /* r[j]: column n + j's 32 values from row m on */
                for (int j = 0; j < 16; j++) _mm512_storeu_si512(dyt + (n + j) * M + m, r[j]);
            }
        for (long c = k0 / 16; c < k1 / 16; c++)
            for (long p = 0; p < M / 2; p++)
                _mm512_storeu_si512(xp + (c * (M / 2) + p) * 32, row_pair(x, ldx, 2 * p, c * 16, idx));
        float buf[32 * 32] __attribute__((aligned(64)));
#pragma omp barrier /* (every run laid out before a block is taken from it) */
        begin();
        for (long i; (i = take(&sh, t)) >= 0;)  /* block i of the longer side ... */
            for (long j = 0; j < (N >= K ? K : N) / 32; j++) {  /* ... by each of the other's */
                long n = (N >= K ? i : j) * 32, c = N >= K ? j : i;
                sums(dyt + n * M, M, xp + c * 32 * M, M, buf);
                for (int r = 0; r < 32; r++)
                    for (int h = 0; h < 2; h++) {
                        __m256i b = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(buf + r * 32 + 16 * h));
                        _mm512_storeu_ps(dw + (n + r) * K + c * 32 + 16 * h,
                                         _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
                    }
            }
        end();
    }
}

#else /* no AVX512-BF16 on this CPU: the library loads, and says so */

int products_ready(int tiles) { return 0; }
void pack_weights(int count, const float *const *W, const long *n, const long *k,
                  uint16_t *const *fwd, uint16_t *const *bwd, int threads) {}
void tile_product(long M, long N, long K, const uint16_t *A, long lda, const uint16_t *B,
                  const uint16_t *bias, uint16_t *C, int threads) {}
void tile_weight_grad(long M, long N, long K, const uint16_t *dy, long ldy, const uint16_t *x,
                      long ldx, float *dw, uint16_t *scratch, int threads) {}

#endif
