/* The update's shared-prompt attention in one call a direction, on bf16 products (AVX512-BF16).
 *
 * The rows are rlvr.models.shared_prefix's unpadded layout: P groups end to end, each its prompt part
 * (Lp positions, left padding included) and its G segments (lens[p*G + g] positions each). A prompt
 * query attends causally to the prompt's real keys (and a padding query to itself); a segment query
 * to the prompt's real keys and to its own segment up to itself. Query head n reads key/value head
 * n / r (r = h / kv). q [N, h, d], k and v [N, kv, d], out [N, h, d] are bf16, row-major.
 *
 * How: for each (group, key/value head) its keys and values are rewritten once into the layouts
 * AVX512-BF16's dot product reads (pairs of channels for the scores, pairs of keys for the values),
 * 16 keys a block; then each query position's r heads take their scores block by block in float32,
 * the softmax in float32 (probabilities rounded to bf16 once, as the torch kernels' are), and the
 * value product. The forward keeps each query's log-sum-exp; the backward recomputes the
 * probabilities from it (no score-sized tensor is kept). Only the blocks a query's mask reaches are
 * computed.
 *
 * Deterministic: every float sum has an order fixed by the shape alone, never by which thread ran
 * what, so two calls on the same inputs give the same bits at any thread count. The forward and dq
 * are per query position. The keys' and values' gradients sum over many query positions: each
 * (group, key/value head)'s query chunks are cut, by the shape, into up to UNITS_MAX contiguous units
 * of about equal work; a unit sums its chunks in order into a float32 buffer of its own (the rows of
 * the keys it reaches: the prompt's and its own segments'), and the units' buffers are then added in
 * unit order. Threads take whole units (dynamically, for balance),
 * which changes who computes a unit but not what it computes.
 *
 * ua_forward and ua_backward return 0, or an error code for a shape without a kernel (d not a
 * multiple of 64 or above 256: 1; h not a multiple of kv: 2; r above RMAX: 3; no memory: 4; built
 * without AVX512-BF16: 5; no groups, segments or prompt positions: 6).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#if defined(UA_SIMDE)
/* The tests' build on CPUs without AVX-512 (tests/cpu/ua_emulated.py): SIMDe's portable versions of
 * the same intrinsics, so that this file's logic (the masks, the reach, the units' order) runs and is
 * checked everywhere. Never used to train: it is many times slower than the hardware's. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#undef _mm512_reduce_add_ps
#define _mm512_reduce_add_ps ua_reduce_add /* SIMDe has none */
static inline float ua_reduce_add(simde__m512 x) {
    float f[16], s = 0;
    simde_mm512_storeu_ps(f, x);
    for (int i = 0; i < 16; i++) s += f[i];
    return s;
}
#define UA_OK 1
#elif defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define UA_OK 1
#else
#define UA_OK 0
#endif

int ua_supported(void) { return UA_OK; }

typedef uint16_t bf16;
#define RMAX 16
#define DMAX 256

typedef struct {
    int P, G, Lp, h, kv, d, r;
    const int32_t *lens;
    const uint8_t *real;
    size_t *row0;   /* [P] each group's first row */
    int *np;        /* [P] each group's rows */
    size_t *pack0;  /* [P] each group's offset in a packed buffer, in bf16 per key/value head (np32 * d each) */
    uint16_t *bits; /* [P][nbmax] each 16-key block's real prompt keys */
    int nbmax;      /* blocks of the longest group, rounded up to even */
} shape_t;

typedef struct {
    int p, i, x0, x1, s; /* group, key/value head, local positions [x0, x1), segment start (-1: prompt) */
} task_t;

static int np32(int n) { return (n + 31) & ~31; }

/* The groups' offsets, the real-key bits, the task list (chunks of up to 16 query positions) and the
 * size of one packed copy of the keys or values (bf16 elements). */
__attribute__((unused)) static int setup(shape_t *S, task_t **tasks, int *ntasks, size_t *packed) {
    int P = S->P, G = S->G;
    S->row0 = malloc(sizeof(size_t) * P);
    S->np = malloc(sizeof(int) * P);
    S->pack0 = malloc(sizeof(size_t) * P);
    if (!S->row0 || !S->np || !S->pack0) return 4;
    size_t row = 0, pk = 0;
    int n_tasks = 0, nb = 0;
    for (int p = 0; p < P; p++) {
        int n = S->Lp;
        n_tasks += (S->Lp + 15) / 16;
        for (int g = 0; g < G; g++) {
            n += S->lens[p * G + g];
            n_tasks += (S->lens[p * G + g] + 15) / 16;
        }
        S->row0[p] = row, S->np[p] = n, S->pack0[p] = pk;
        row += n, pk += (size_t)np32(n) * S->d * S->kv;
        if (np32(n) / 16 > nb) nb = np32(n) / 16;
    }
    S->nbmax = nb;
    S->bits = calloc((size_t)P * nb, sizeof(uint16_t));
    *tasks = malloc(sizeof(task_t) * (size_t)n_tasks * S->kv);
    if (!S->bits || !*tasks) return 4;
    for (int p = 0; p < P; p++)
        for (int j = 0; j < S->Lp; j++)
            if (S->real[(size_t)p * S->Lp + j]) S->bits[(size_t)p * nb + j / 16] |= (uint16_t)(1u << (j % 16));
    int t = 0;
    for (int p = 0; p < P; p++)
        for (int i = 0; i < S->kv; i++) {
            for (int x = 0; x < S->Lp; x += 16)
                (*tasks)[t++] = (task_t){p, i, x, x + 16 < S->Lp ? x + 16 : S->Lp, -1};
            int s = S->Lp;
            for (int g = 0; g < G; g++) {
                int l = S->lens[p * G + g];
                for (int x = 0; x < l; x += 16) (*tasks)[t++] = (task_t){p, i, s + x, s + (x + 16 < l ? x + 16 : l), s};
                s += l;
            }
        }
    *ntasks = t;
    *packed = pk;
    return 0;
}

__attribute__((unused)) static void release(shape_t *S, task_t *tasks) {
    free(S->row0), free(S->np), free(S->pack0), free(S->bits), free(tasks);
}

static int check(int P, int G, int Lp, int h, int kv, int d) {
    if (P <= 0 || G <= 0 || Lp <= 0) return 6;
    if (d % 64 || d > DMAX || d <= 0) return 1;
    if (kv <= 0 || h % kv) return 2;
    if (h / kv > RMAX) return 3;
    return UA_OK ? 0 : 5;
}

#if UA_OK

/* A group's key/value head's rows (src, row stride `stride` bf16) as score operands: per block of 16
 * keys, for each pair of channels, 16 (key, channel pair) words; keys past n are zero. */
static void pack_pairs_of_channels(const bf16 *src, size_t stride, int n, int d, bf16 *dst) {
    int n32 = np32(n), d2 = d / 2;
    uint32_t *out = (uint32_t *)dst;
    for (int j = 0; j < n32; j++)
        for (int c2 = 0; c2 < d2; c2++) {
            uint32_t w = 0;
            if (j < n) memcpy(&w, src + j * stride + 2 * c2, 4);
            out[((size_t)(j / 16) * d2 + c2) * 16 + j % 16] = w;
        }
}

/* The same rows as value operands: per pair of keys, per block of 16 channels, 16 (channel, key pair)
 * words; keys past n are zero. */
static void pack_pairs_of_keys(const bf16 *src, size_t stride, int n, int d, bf16 *dst) {
    int n32 = np32(n), dc = d / 16;
    for (int j = 0; j < n32; j++)
        for (int c = 0; c < d; c++)
            dst[((size_t)(j / 2) * dc + c / 16) * 32 + (c % 16) * 2 + j % 2] = j < n ? src[j * stride + c] : 0;
}

static inline __m512bh pair_of(const bf16 *p) {
    int32_t w;
    memcpy(&w, p, 4);
    return (__m512bh)_mm512_set1_epi32(w);
}

static inline __m512bh load_bh(const void *p) { return (__m512bh)_mm512_loadu_si512(p); }

static inline __m512 load_bf16(const bf16 *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

#if defined(UA_SIMDE)
/* vcvtneps2bf16 by hand (SIMDe has no version of it): round to nearest even, NaNs kept quiet. */
static inline void store_bf16(bf16 *p, __m512 x) {
    float f[16];
    _mm512_storeu_ps(f, x);
    for (int i = 0; i < 16; i++) {
        uint32_t u;
        memcpy(&u, f + i, 4);
        p[i] = (u & 0x7fffffffu) > 0x7f800000u ? (bf16)((u >> 16) | 0x40u) : (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}
#else
static inline void store_bf16(bf16 *p, __m512 x) { _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(x)); }
#endif

/* exp(x) within 2 ulp for x in [-87.3, 88] (Cephes' expf, as decode_kernels.c's vexp). */
static inline __m512 vexp(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

/* Bits of the lanes of block b whose keys are in [lo, hi]. */
static inline uint16_t span(int b, int lo, int hi) {
    int l0 = lo - 16 * b, l1 = hi - 16 * b;
    if (l0 < 0) l0 = 0;
    if (l1 > 15) l1 = 15;
    if (l0 > l1) return 0;
    return (uint16_t)((0xFFFFu >> (15 - l1)) & (0xFFFFu << l0));
}

/* The blocks a query reaches, as two even-aligned intervals [0, a) and [b0, b1), and each block's mask. */
typedef struct {
    int a, b0, b1;
} reach_t;

static reach_t reach(const shape_t *S, int p, int x, int s) {
    int nb = np32(S->np[p]) / 16, last = x / 16 + 1;
    reach_t R;
    if (s < 0) {
        R.a = (last + 1) & ~1, R.b0 = R.b1 = R.a;
    } else {
        R.a = ((S->Lp + 15) / 16 + 1) & ~1;
        R.b0 = (s / 16) & ~1, R.b1 = (last + 1) & ~1;
        if (R.b0 < R.a) R.b0 = R.a;
        if (R.b1 < R.b0) R.b1 = R.b0;
    }
    if (R.a > nb) R.a = nb;
    if (R.b1 > nb) R.b1 = nb;
    return R;
}

static inline uint16_t mask_of(const shape_t *S, int p, int x, int s, int b) {
    const uint16_t real = S->bits[(size_t)p * S->nbmax + b];
    if (s < 0) return (uint16_t)((real & span(b, 0, x)) | span(b, x, x));
    return (uint16_t)(real | span(b, s, x));
}

/* sc[a][16b + l] = scale * (q_a . key 16b + l) for NH heads (rows q + a * d, bf16) and the block pairs
 * [b0, b1); kp: pack_pairs_of_channels' layout. */
#define DOTS(NH)                                                                                        \
    static void dots_##NH(const bf16 *q, int d, const bf16 *kp, int b0, int b1, float *sc, int ld,      \
                          float scale) {                                                                \
        const int d2 = d / 2;                                                                           \
        const __m512 sv = _mm512_set1_ps(scale);                                                        \
        for (int b = b0; b < b1; b += 2) {                                                              \
            __m512 acc[NH][2];                                                                          \
            for (int a = 0; a < NH; a++) acc[a][0] = acc[a][1] = _mm512_setzero_ps();                   \
            const uint32_t *k0 = (const uint32_t *)kp + (size_t)b * d2 * 16, *k1 = k0 + (size_t)d2 * 16; \
            for (int c2 = 0; c2 < d2; c2++) {                                                           \
                const __m512bh x0 = load_bh(k0 + c2 * 16), x1 = load_bh(k1 + c2 * 16);                  \
                for (int a = 0; a < NH; a++) {                                                          \
                    const __m512bh qa = pair_of(q + (size_t)a * d + 2 * c2);                            \
                    acc[a][0] = _mm512_dpbf16_ps(acc[a][0], x0, qa);                                    \
                    acc[a][1] = _mm512_dpbf16_ps(acc[a][1], x1, qa);                                    \
                }                                                                                       \
            }                                                                                           \
            for (int a = 0; a < NH; a++) {                                                              \
                _mm512_storeu_ps(sc + (size_t)a * ld + 16 * b, _mm512_mul_ps(acc[a][0], sv));           \
                _mm512_storeu_ps(sc + (size_t)a * ld + 16 * b + 16, _mm512_mul_ps(acc[a][1], sv));      \
            }                                                                                           \
        }                                                                                               \
    }
DOTS(1)
DOTS(2)
DOTS(3)
DOTS(4)

/* For r heads, in chunks of up to 4: the scores of both reach intervals. */
static void dots(const bf16 *q, int r, int d, const bf16 *kp, reach_t R, float *sc, int ld, float scale) {
    for (int a = 0; a < r; a += 4) {
        const int nh = r - a < 4 ? r - a : 4;
        const bf16 *qa = q + (size_t)a * d;
        float *sa = sc + (size_t)a * ld;
        for (int part = 0; part < 2; part++) {
            const int b0 = part ? R.b0 : 0, b1 = part ? R.b1 : R.a;
            if (b0 >= b1) continue;
            switch (nh) {
            case 1: dots_1(qa, d, kp, b0, b1, sa, ld, scale); break;
            case 2: dots_2(qa, d, kp, b0, b1, sa, ld, scale); break;
            case 3: dots_3(qa, d, kp, b0, b1, sa, ld, scale); break;
            default: dots_4(qa, d, kp, b0, b1, sa, ld, scale); break;
            }
        }
    }
}

/* out[a][c] = scale * sum_j w[a][j] v[j][c] (bf16 weights, rows of ld) over the block pairs [b0, b1),
 * for NH heads and 64 channels from c0; vp: pack_pairs_of_keys' layout. Accumulates into acc. */
#define COMBINE(NH)                                                                                     \
    static void combine_##NH(const bf16 *w, int ld, const bf16 *vp, int d, int c0, int b0, int b1,     \
                             __m512 acc[][4]) {                                                         \
        const int dc = d / 16;                                                                          \
        __m512 s[NH][4];                                                                                \
        for (int a = 0; a < NH; a++)                                                                    \
            for (int c = 0; c < 4; c++) s[a][c] = acc[a][c];                                            \
        for (int j2 = b0 * 8; j2 < b1 * 8; j2++) {                                                      \
            const bf16 *row = vp + ((size_t)j2 * dc + c0 / 16) * 32;                                    \
            const __m512bh v0 = load_bh(row), v1 = load_bh(row + 32), v2 = load_bh(row + 64),           \
                           v3 = load_bh(row + 96);                                                      \
            for (int a = 0; a < NH; a++) {                                                              \
                const __m512bh wa = pair_of(w + (size_t)a * ld + 2 * j2);                               \
                s[a][0] = _mm512_dpbf16_ps(s[a][0], v0, wa);                                            \
                s[a][1] = _mm512_dpbf16_ps(s[a][1], v1, wa);                                            \
                s[a][2] = _mm512_dpbf16_ps(s[a][2], v2, wa);                                            \
                s[a][3] = _mm512_dpbf16_ps(s[a][3], v3, wa);                                            \
            }                                                                                           \
        }                                                                                               \
        for (int a = 0; a < NH; a++)                                                                    \
            for (int c = 0; c < 4; c++) acc[a][c] = s[a][c];                                            \
    }
COMBINE(1)
COMBINE(2)
COMBINE(3)
COMBINE(4)

/* out[a][:] (float32, rows of d) = sum_j w[a][j] v[j][:] for r heads over both reach intervals. */
static void combine(const bf16 *w, int ld, int r, const bf16 *vp, int d, reach_t R, float *out) {
    for (int a = 0; a < r; a += 4) {
        const int nh = r - a < 4 ? r - a : 4;
        for (int c0 = 0; c0 < d; c0 += 64) {
            __m512 acc[4][4];
            for (int x = 0; x < 4; x++)
                for (int c = 0; c < 4; c++) acc[x][c] = _mm512_setzero_ps();
            for (int part = 0; part < 2; part++) {
                const int b0 = part ? R.b0 : 0, b1 = part ? R.b1 : R.a;
                if (b0 >= b1) continue;
                const bf16 *wa = w + (size_t)a * ld;
                switch (nh) {
                case 1: combine_1(wa, ld, vp, d, c0, b0, b1, acc); break;
                case 2: combine_2(wa, ld, vp, d, c0, b0, b1, acc); break;
                case 3: combine_3(wa, ld, vp, d, c0, b0, b1, acc); break;
                default: combine_4(wa, ld, vp, d, c0, b0, b1, acc); break;
                }
            }
            for (int x = 0; x < nh; x++)
                for (int c = 0; c < 4; c++) _mm512_storeu_ps(out + (size_t)(a + x) * d + c0 + 16 * c, acc[x][c]);
        }
    }
}

#define FOR_BLOCKS(R, b) \
    for (int part_ = 0; part_ < 2; part_++) \
        for (int b = part_ ? (R).b0 : 0; b < (part_ ? (R).b1 : (R).a); b++)

/* Every (group, key/value head)'s rows of chan_src as score operands (into chan) and of key_src as
 * value operands (into keys); a NULL source is skipped. In parallel; ends at the for's barrier. */
static void pack_all(const shape_t *S, const bf16 *chan_src, const bf16 *key_src, bf16 *chan, bf16 *keys) {
    const int kv = S->kv, d = S->d;
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int p = 0; p < S->P; p++)
        for (int i = 0; i < kv; i++) {
            const size_t at = S->pack0[p] + (size_t)i * np32(S->np[p]) * d, src = (S->row0[p] * kv + i) * d;
            if (chan_src) pack_pairs_of_channels(chan_src + src, (size_t)kv * d, S->np[p], d, chan + at);
            if (key_src) pack_pairs_of_keys(key_src + src, (size_t)kv * d, S->np[p], d, keys + at);
        }
}

/* One query position's forward: probabilities into pr (bf16, rows of ld), out rows and lse. */
static void forward_row(const shape_t *S, const task_t *t, int x, const bf16 *q, const bf16 *kp, const bf16 *vp,
                        float scale, float *sc, bf16 *pr, float *o, int ld, bf16 *out, float *lse) {
    const int r = S->r, d = S->d;
    const size_t row = S->row0[t->p] + x, h0 = (size_t)t->i * r;
    const reach_t R = reach(S, t->p, x, t->s);
    dots(q + (row * S->h + h0) * d, r, d, kp, R, sc, ld, scale);
    for (int a = 0; a < r; a++) {
        float *s = sc + (size_t)a * ld;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        FOR_BLOCKS(R, b) mx = _mm512_mask_max_ps(mx, mask_of(S, t->p, x, t->s, b), mx, _mm512_loadu_ps(s + 16 * b));
        const float m = _mm512_reduce_max_ps(mx);
        __m512 sum = _mm512_setzero_ps();
        FOR_BLOCKS(R, b) {
            const __m512 e = _mm512_maskz_mov_ps(mask_of(S, t->p, x, t->s, b),
                                                 vexp(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * b), _mm512_set1_ps(m))));
            _mm512_storeu_ps(s + 16 * b, e);
            sum = _mm512_add_ps(sum, e);
        }
        const float total = _mm512_reduce_add_ps(sum);
        const __m512 inv = _mm512_set1_ps(1.0f / total);
        FOR_BLOCKS(R, b) store_bf16(pr + (size_t)a * ld + 16 * b, _mm512_mul_ps(_mm512_loadu_ps(s + 16 * b), inv));
        lse[row * S->h + h0 + a] = m + logf(total);
    }
    combine(pr, ld, r, vp, d, R, o);
    for (int a = 0; a < r; a++)
        for (int c = 0; c < d; c += 16)
            store_bf16(out + (row * S->h + h0 + a) * d + c, _mm512_loadu_ps(o + (size_t)a * d + c));
}


/* Thread-local buffers of a backward, rows of ld: the scores then p and dP then dS (float32) of the
 * position in hand; p and dS in bf16 for each of a pair of positions (slot 0, 1); the pairs'
 * interleaved coefficients; dq's float32 row; the keys a pair reaches. */
typedef struct {
    float *p, *dp, *o;
    bf16 *pb[2], *ds[2];
    uint32_t *pair;
    int *js, *rows;
} bwork_t;

/* A unit of the keys' and values' gradients: tasks [t0, t1) of one (group p, key/value head i), summed
 * in order into float32 rows of its own at off in the units' dk and dv buffers (row stride d; dk
 * without the scale, applied once when the units are added): the group's keys [0, prompt), then
 * [s_lo, hi) (its segments' keys; s_lo = hi where it has none) at rows prompt.. (key j at j - shift). */
typedef struct {
    int t0, t1, p, i, prompt, s_lo, hi, shift;
    size_t off;
} unit_t;

/* At most this many units a (group, key/value head): enough for dynamic scheduling to balance a few
 * threads, few enough that the prompt's rows, which every unit holds, stay a small share of the sums. */
#define UNITS_MAX 4

/* 16 bf16 of a and 16 of b (either NULL: zeros) interleaved: a0 b0 a1 b1 ... */
static inline __m512i interleave(const bf16 *a, const bf16 *b) {
    static const uint16_t idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m256i lo = a ? _mm256_loadu_si256((const __m256i *)a) : _mm256_setzero_si256();
    const __m256i hi = b ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256();
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

static inline int in_reach(reach_t R, int b) { return b < R.a || (b >= R.b0 && b < R.b1); }

/* acc[j] (rows of stride, 64 channels from c0) += sum over NH heads a of the pair (c[a][j]) . z[a]:
 * two query positions' rank-NH updates in one bf16 dot product a channel block, z in registers. */
#define PAIRS(NH)                                                                                       \
    static void pairs_##NH(const uint32_t *c, int ld, const __m512i *z, const int *js, const int *rows, \
                           int nj, float *acc, size_t stride, int c0) {                                \
        __m512bh zr[NH][4];                                                                             \
        for (int a = 0; a < NH; a++)                                                                    \
            for (int x = 0; x < 4; x++) zr[a][x] = (__m512bh)z[a * 16 + c0 / 16 + x];                   \
        for (int n = 0; n < nj; n++) {                                                                  \
            const int j = js[n];                                                                        \
            float *dst = acc + (size_t)rows[n] * stride + c0;                                           \
            __m512 s0 = _mm512_loadu_ps(dst), s1 = _mm512_loadu_ps(dst + 16), s2 = _mm512_loadu_ps(dst + 32), \
                   s3 = _mm512_loadu_ps(dst + 48);                                                      \
            for (int a = 0; a < NH; a++) {                                                              \
                const __m512bh y = (__m512bh)_mm512_set1_epi32((int)c[(size_t)a * ld + j]);             \
                s0 = _mm512_dpbf16_ps(s0, zr[a][0], y);                                                 \
                s1 = _mm512_dpbf16_ps(s1, zr[a][1], y);                                                 \
                s2 = _mm512_dpbf16_ps(s2, zr[a][2], y);                                                 \
                s3 = _mm512_dpbf16_ps(s3, zr[a][3], y);                                                 \
            }                                                                                           \
            _mm512_storeu_ps(dst, s0), _mm512_storeu_ps(dst + 16, s1);                                  \
            _mm512_storeu_ps(dst + 32, s2), _mm512_storeu_ps(dst + 48, s3);                             \
        }                                                                                               \
    }
PAIRS(1)
PAIRS(2)
PAIRS(3)
PAIRS(4)

/* The keys' and values' gradients of query positions x and x + 1 (nx = 1: x alone), whose p and dS
 * are in slots 0 and 1: dk[j] += sum_a dS[a][j] q[a], dv[j] += sum_a p[a][j] dout[a] over both
 * positions, as bf16 pairs (one position per half of each pair) into the unit's float32 sums dk, dv
 * (the group's key rows, stride d). */
static void key_grads(const shape_t *S, const task_t *t, int x, int nx, const bf16 *q, const bf16 *dout, int ld,
                      bwork_t *w, const unit_t *U, float *dk, float *dv) {
    const int r = S->r, d = S->d;
    const size_t h0 = (size_t)t->i * r, stride = (size_t)d;
    const reach_t R0 = reach(S, t->p, x, t->s), R = reach(S, t->p, x + nx - 1, t->s);
    int nj = 0;
    FOR_BLOCKS(R, b) {
        uint32_t m = mask_of(S, t->p, x, t->s, b) | (nx > 1 ? mask_of(S, t->p, x + 1, t->s, b) : 0);
        for (; m; m &= m - 1) {
            const int j = 16 * b + __builtin_ctz(m);
            w->rows[nj] = j < U->prompt ? j : j - U->shift;
            w->js[nj++] = j;
        }
    }
    __m512i z[RMAX * 16]; /* [head][channel block]: the two positions' rows interleaved */
    for (int pass = 0; pass < 2; pass++) {
        const bf16 *src = pass ? dout : q;
        bf16 *const *coef = pass ? w->pb : w->ds;
        float *acc = pass ? dv : dk;
        for (int a = 0; a < r; a++) {
            const bf16 *r0 = src + ((S->row0[t->p] + x) * S->h + h0 + a) * d, *r1 = nx > 1 ? r0 + (size_t)S->h * d : NULL;
            for (int c = 0; c < d; c += 16) z[a * 16 + c / 16] = interleave(r0 + c, r1 ? r1 + c : NULL);
            FOR_BLOCKS(R, b) {
                const size_t at = (size_t)a * ld + 16 * b;
                const __m512i v = interleave(in_reach(R0, b) ? coef[0] + at : NULL, nx > 1 ? coef[1] + at : NULL);
                _mm512_storeu_si512(w->pair + at, v);
            }
        }
        for (int a = 0; a < r; a += 4)
            for (int c0 = 0; c0 < d; c0 += 64) {
                const uint32_t *cf = w->pair + (size_t)a * ld;
                switch (r - a < 4 ? r - a : 4) {
                case 1: pairs_1(cf, ld, z + a * 16, w->js, w->rows, nj, acc, stride, c0); break;
                case 2: pairs_2(cf, ld, z + a * 16, w->js, w->rows, nj, acc, stride, c0); break;
                case 3: pairs_3(cf, ld, z + a * 16, w->js, w->rows, nj, acc, stride, c0); break;
                default: pairs_4(cf, ld, z + a * 16, w->js, w->rows, nj, acc, stride, c0); break;
                }
            }
    }
}

/* One query position's backward up to its keys: dq rows written; p and dS (bf16) into slot u. */
static void backward_row(const shape_t *S, const task_t *t, int x, int u, const bf16 *q, const bf16 *dout,
                         const bf16 *kp, const bf16 *vkp, const bf16 *kvp, const float *lse, float scale, int ld,
                         bwork_t *w, bf16 *dq) {
    const int r = S->r, d = S->d;
    const size_t row = S->row0[t->p] + x, h0 = (size_t)t->i * r;
    const reach_t R = reach(S, t->p, x, t->s);
    dots(q + (row * S->h + h0) * d, r, d, kp, R, w->p, ld, scale);
    dots(dout + (row * S->h + h0) * d, r, d, vkp, R, w->dp, ld, 1.0f);
    for (int a = 0; a < r; a++) {
        float *p = w->p + (size_t)a * ld, *dp = w->dp + (size_t)a * ld;
        const __m512 l = _mm512_set1_ps(lse[row * S->h + h0 + a]);
        __m512 D = _mm512_setzero_ps();
        FOR_BLOCKS(R, b) {
            const __m512 e = _mm512_maskz_mov_ps(mask_of(S, t->p, x, t->s, b),
                                                 vexp(_mm512_sub_ps(_mm512_loadu_ps(p + 16 * b), l)));
            _mm512_storeu_ps(p + 16 * b, e);
            store_bf16(w->pb[u] + (size_t)a * ld + 16 * b, e);
            D = _mm512_fmadd_ps(e, _mm512_loadu_ps(dp + 16 * b), D);
        }
        const __m512 Dv = _mm512_set1_ps(_mm512_reduce_add_ps(D));
        FOR_BLOCKS(R, b) {
            const __m512 ds = _mm512_mul_ps(_mm512_loadu_ps(p + 16 * b), _mm512_sub_ps(_mm512_loadu_ps(dp + 16 * b), Dv));
            store_bf16(w->ds[u] + (size_t)a * ld + 16 * b, ds);
        }
    }
    combine(w->ds[u], ld, r, kvp, d, R, w->o);
    const __m512 sv = _mm512_set1_ps(scale);
    for (int a = 0; a < r; a++)
        for (int c = 0; c < d; c += 16)
            store_bf16(dq + (row * S->h + h0 + a) * d + c, _mm512_mul_ps(_mm512_loadu_ps(w->o + (size_t)a * d + c), sv));
}

static void free_work(bwork_t *w) {
    free(w->p), free(w->dp), free(w->o), free(w->pb[0]), free(w->pb[1]), free(w->ds[0]), free(w->ds[1]);
    free(w->pair), free(w->js), free(w->rows);
}

/* Each (group, key/value head)'s tasks (consecutive in the task list) cut into up to UNITS_MAX units of
 * about equal work (a position's work: the keys it reaches), each unit's rows up to the last key its
 * positions reach, and the buffers' offsets; first[p * kv + i] is that pair's first unit (first[P * kv]:
 * all of them). Decided by the shape alone. Returns 0 or 4 (no memory). */
static int split_units(const shape_t *S, const task_t *tasks, int ntasks, unit_t **units, int *nunits, int **first,
                       size_t *floats) {
    const int pairs = S->P * S->kv;
    *units = malloc(sizeof(unit_t) * ((size_t)pairs * UNITS_MAX + 1));
    *first = malloc(sizeof(int) * ((size_t)pairs + 1));
    double *cost = malloc(sizeof(double) * ((size_t)ntasks + 1));
    if (!*units || !*first || !cost) return free(cost), 4;
    for (int n = 0; n < ntasks; n++) {
        const task_t *t = &tasks[n];
        double c = 0;
        for (int x = t->x0; x < t->x1; x++) c += t->s < 0 ? x + 1 : S->Lp + (x - t->s + 1);
        cost[n] = c;
    }
    int u = 0, n = 0;
    size_t off = 0;
    for (int pi = 0; pi < pairs; pi++) {
        (*first)[pi] = u;
        const int p = pi / S->kv, i = pi % S->kv;
        int end = n;
        double total = 0;
        while (end < ntasks && tasks[end].p == p && tasks[end].i == i) total += cost[end++];
        const int parts = end - n < UNITS_MAX ? end - n : UNITS_MAX;
        double done = 0;
        for (int k = 0; k < parts && n < end; k++) {
            const int t0 = n;
            const double goal = total * (k + 1) / parts;
            do done += cost[n++];
            while (n < end && done + 0.5 * cost[n] <= goal && end - n > parts - 1 - k);
            if (k == parts - 1) n = end, done = total;
            int hi = 0, s_lo = -1;
            for (int m = t0; m < n; m++) {
                hi = tasks[m].x1 > hi ? tasks[m].x1 : hi;
                if (tasks[m].s >= 0 && s_lo < 0) s_lo = tasks[m].s;
            }
            const int prompt = s_lo < 0 ? hi : S->Lp; /* a segment's queries reach every prompt key */
            if (s_lo < 0) s_lo = hi;
            (*units)[u++] = (unit_t){t0, n, p, i, prompt, s_lo, hi, s_lo - prompt, off};
            off += (size_t)(prompt + hi - s_lo) * S->d;
        }
    }
    (*first)[pairs] = u;
    *nunits = u, *floats = off;
    free(cost);
    return 0;
}

/* out (dk or dv, [N, kv, d] bf16) = f * the sum of each key row's units' float32 rows (buf), added in
 * unit order. Work-shared over rows. */
static void add_units(const shape_t *S, const unit_t *units, const int *first, const int *group, size_t rows,
                      const float *buf, float f, bf16 *out) {
    const int kv = S->kv, d = S->d;
    const __m512 fv = _mm512_set1_ps(f);
#pragma omp for schedule(static)
    for (size_t e = 0; e < rows * kv; e++) {
        const size_t row = e / kv;
        const int i = (int)(e % kv), p = group[row], j = (int)(row - S->row0[p]);
        const int u0 = first[p * kv + i], u1 = first[p * kv + i + 1];
        for (int c = 0; c < d; c += 16) {
            __m512 s = _mm512_setzero_ps();
            for (int u = u0; u < u1; u++) {
                const unit_t *U = &units[u];
                const int at = j < U->prompt ? j : (j >= U->s_lo && j < U->hi ? j - U->shift : -1);
                if (at >= 0) s = _mm512_add_ps(s, _mm512_loadu_ps(buf + U->off + (size_t)at * d + c));
            }
            store_bf16(out + e * d + c, _mm512_mul_ps(s, fv));
        }
    }
}

#endif /* UA_OK */

int ua_forward(const bf16 *q, const bf16 *k, const bf16 *v, const uint8_t *real, const int32_t *lens, int P, int G,
               int Lp, int h, int kv, int d, float scale, bf16 *out, float *lse) {
    int rc = check(P, G, Lp, h, kv, d);
    if (rc) return rc;
#if UA_OK
    shape_t S = {P, G, Lp, h, kv, d, h / kv, lens, real, 0, 0, 0, 0, 0};
    task_t *tasks = NULL;
    int ntasks = 0;
    size_t packed = 0;
    if ((rc = setup(&S, &tasks, &ntasks, &packed))) return release(&S, tasks), rc;
    bf16 *kp = aligned_alloc(64, packed * 2 + 64), *vp = aligned_alloc(64, packed * 2 + 64);
    if (!kp || !vp) return free(kp), free(vp), release(&S, tasks), 4;
    const int ld = S.nbmax * 16;
    int failed = 0;
#pragma omp parallel
    {
        pack_all(&S, k, v, kp, vp); /* ends with the for's barrier */
        float *sc = malloc(sizeof(float) * ((size_t)S.r * ld + (size_t)S.r * d));
        bf16 *pr = malloc(sizeof(bf16) * (size_t)S.r * ld);
        if (!sc || !pr) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
#pragma omp for schedule(dynamic, 1)
            for (int n = 0; n < ntasks; n++) {
                const task_t *t = &tasks[n];
                const size_t at = S.pack0[t->p] + (size_t)t->i * np32(S.np[t->p]) * d;
                for (int x = t->x0; x < t->x1; x++)
                    forward_row(&S, t, x, q, kp + at, vp + at, scale, sc, pr, sc + (size_t)S.r * ld, ld, out, lse);
            }
        }
        free(sc), free(pr);
    }
    free(kp), free(vp), release(&S, tasks);
    return failed ? 4 : 0;
#else
    (void)q, (void)k, (void)v, (void)real, (void)lens, (void)P, (void)G, (void)Lp, (void)scale, (void)out, (void)lse;
    return 5;
#endif
}

int ua_backward(const bf16 *q, const bf16 *k, const bf16 *v, const uint8_t *real, const int32_t *lens, int P, int G,
                int Lp, int h, int kv, int d, float scale, const bf16 *dout, const float *lse, bf16 *dq, bf16 *dk,
                bf16 *dv) {
    int rc = check(P, G, Lp, h, kv, d);
    if (rc) return rc;
#if UA_OK
    shape_t S = {P, G, Lp, h, kv, d, h / kv, lens, real, 0, 0, 0, 0, 0};
    task_t *tasks = NULL;
    int ntasks = 0;
    size_t packed = 0;
    if ((rc = setup(&S, &tasks, &ntasks, &packed))) return release(&S, tasks), rc;
    const size_t rows = S.row0[P - 1] + S.np[P - 1];
    unit_t *units = NULL;
    int nunits = 0, *first = NULL;
    size_t floats = 0;
    int *group = malloc(sizeof(int) * rows);
    bf16 *kp = aligned_alloc(64, packed * 2 + 64), *vkp = aligned_alloc(64, packed * 2 + 64),
         *kvp = aligned_alloc(64, packed * 2 + 64);
    float *dkb = NULL, *dvb = NULL;
    if (!(rc = split_units(&S, tasks, ntasks, &units, &nunits, &first, &floats))) {
        dkb = malloc(sizeof(float) * floats + 64), dvb = malloc(sizeof(float) * floats + 64);
        if (!dkb || !dvb) rc = 4;
    }
    if (rc || !group || !kp || !vkp || !kvp) {
        free(kp), free(vkp), free(kvp), free(group), free(units), free(first), free(dkb), free(dvb), release(&S, tasks);
        return 4;
    }
    for (int p = 0; p < P; p++)
        for (int j = 0; j < S.np[p]; j++) group[S.row0[p] + j] = p;
    const int ld = S.nbmax * 16;
    int failed = 0;
#pragma omp parallel
    {
        pack_all(&S, k, k, kp, kvp);
        pack_all(&S, v, NULL, vkp, NULL);
        const size_t rows_ld = (size_t)S.r * ld;
        bwork_t w = {malloc(sizeof(float) * rows_ld), malloc(sizeof(float) * rows_ld), malloc(sizeof(float) * (size_t)S.r * d),
                     {malloc(sizeof(bf16) * rows_ld), malloc(sizeof(bf16) * rows_ld)},
                     {malloc(sizeof(bf16) * rows_ld), malloc(sizeof(bf16) * rows_ld)},
                     malloc(sizeof(uint32_t) * rows_ld), malloc(sizeof(int) * (size_t)ld), malloc(sizeof(int) * (size_t)ld)};
        if (!w.p || !w.dp || !w.o || !w.pb[0] || !w.pb[1] || !w.ds[0] || !w.ds[1] || !w.pair || !w.js || !w.rows) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        /* failed is final here */
        if (!failed) {
#pragma omp for schedule(dynamic, 1)
            for (int n = 0; n < nunits; n++) {
                const unit_t *U = &units[n];
                float *dku = dkb + U->off, *dvu = dvb + U->off;
                const size_t n_rows = (size_t)(U->prompt + U->hi - U->s_lo);
                memset(dku, 0, sizeof(float) * n_rows * d), memset(dvu, 0, sizeof(float) * n_rows * d);
                for (int m = U->t0; m < U->t1; m++) {
                    const task_t *t = &tasks[m];
                    const size_t at = S.pack0[t->p] + (size_t)t->i * np32(S.np[t->p]) * d;
                    for (int x = t->x0; x < t->x1; x += 2) {
                        const int nx = x + 1 < t->x1 ? 2 : 1;
                        for (int u = 0; u < nx; u++)
                            backward_row(&S, t, x + u, u, q, dout, kp + at, vkp + at, kvp + at, lse, scale, ld, &w, dq);
                        key_grads(&S, t, x, nx, q, dout, ld, &w, U, dku, dvu);
                    }
                }
            }
            add_units(&S, units, first, group, rows, dkb, scale, dk);
            add_units(&S, units, first, group, rows, dvb, 1.0f, dv);
        }
        free_work(&w);
    }
    free(kp), free(vkp), free(kvp), free(group), free(units), free(first), free(dkb), free(dvb), release(&S, tasks);
    return failed ? 4 : 0;
#else
    (void)q, (void)k, (void)v, (void)real, (void)lens, (void)P, (void)G, (void)Lp, (void)scale, (void)dout, (void)lse;
    (void)dq, (void)dk, (void)dv;
    return 5;
#endif
}
