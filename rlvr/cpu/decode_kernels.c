/* Kernels of the lean decode step (rlvr/cpu/lean.py): one whole decode step of a Llama-family
 * model (lean_step), its products on their own (lean_linear, for the tests and any caller).
 *
 * Compiled on the machine that runs it, at first use (rlvr/cpu/kernels.py: cc -O3 -march=native
 * -fopenmp), and called through ctypes with the tensors' data pointers. OpenMP shares torch's runtime
 * (libgomp.so.1, already loaded), so the thread count is torch's.
 *
 * lean_step runs every layer in one OpenMP parallel region, each stage a work-shared loop with a
 * barrier after it: RMSNorm over columns; [q; k; v] over weight panels; rotary, the cache write,
 * scores, softmax and the weighted values over (row, key/value head) pairs; their output to k-major
 * over columns; o (+ the residual); RMSNorm; gate and up together, silu(gate) * up, over panels;
 * down (+ the residual); then the final norm and the LM head. No Python between the stages: the step before it made about 20 torch or
 * ctypes calls a layer, each a few microseconds with the other thread idle.
 *
 * Deterministic (checked for issue 58): every work-shared loop is schedule(static) and each output
 * element (a panel's columns, a (row, key/value head)'s attention, a row's sampled token) is computed
 * whole by one thread, its sums in an order fixed by the shape; no per-thread partial sums, atomics or
 * reductions across threads. So a step's bits depend on its inputs alone, not on the thread count.
 *
 * Products: y = x W^T + bias, then + or * another tensor, for the few rows of a decode step. W is
 * stored in panels of VL output columns, [ceil(N / VL), K, VL], each read once from memory front to
 * back (prefetched ahead) while up to 16 rows accumulate in registers: the weight stream and the
 * arithmetic overlap, which oneDNN's prepacked product does not manage at 8-16 rows. A product's
 * input x is stored k-major (xt_at): the stages before a product write it so.
 *
 * Attention over a cascade cache, float32, contiguous; b live rows, H query heads, KV key/value
 * heads, rep = H / KV, head size D, t response positions before this step:
 *   qkv      [b, (H + 2 KV) D]    the [q; k; v] product of the step's token, before rotary
 *   cos, sin [b, D]               the rotary tables at each row's position
 *   keys_t   [rows, KV, cap / VL, D, VL]  the rows' response keys, transposed in blocks of VL positions:
 *                                a block's D x VL floats are contiguous, so the scores over positions
 *                                0..t read one contiguous run (faster than [D, cap]: benchmarks/NOTES.md);
 *                                CascadeCache allocates it as [rows, KV, D, cap]
 *   values   [rows, KV, cap, D]   the rows' response values
 *   prompt_kt [P, KV, D, L]       the prompts' keys, transposed; prompt_v [P, KV, L, D]
 *   bias     [P, L]               0, or -inf on a prompt's padding (left, and up to L)
 *   prompt   [b]                  the prompt each live row samples from
 *   cache_row [b]                 each live row's index in keys_t / values (its row in the batch)
 * L and cap are multiples of VL, so scores are whole vectors: a prompt's positions beyond its own
 * length have zero keys and values and a -inf bias; response positions past t are set to -inf.
 * Rows keep their index in keys_t / values when others finish (the cache does not move them), so
 * each (row, key/value head) pair writes only its own positions: the pairs run in parallel without locks.
 *
 * Vectors are GCC's vector extension, as wide as the CPU's (VL floats). A score is accumulated in
 * the lane of its key position (keys transposed), so no horizontal sums are needed; an output row in
 * D / VL registers per query head. exp is a vector polynomial (Cephes' expf, within 2 ulp).
 * Results differ from torch's products, norms and softmax by float rounding (the order of the sums).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

/* The CPU's vector width: 16 floats with AVX-512, else 8 (AVX2; GCC splits wider generic vectors badly:
 * 64-byte vectors built for AVX2 ran the whole rollout slower, benchmarks/NOTES.md). */
#if defined(__AVX512F__)
#define VL 16
#else
#define VL 8
#endif
typedef float vf __attribute__((vector_size(VL * 4), aligned(4)));

/* A vector store that bypasses the caches (p aligned to the vector), where the CPU has one. */
#if defined(__AVX512F__)
#define STREAM(p, v) _mm512_stream_ps((p), _mm512_load_ps(v))
#elif defined(__AVX__)
#define STREAM(p, v) _mm256_stream_ps((p), _mm256_load_ps(v))
#else
#define STREAM(p, v) memcpy((p), (v), sizeof(vf))
#endif

#define LOAD(p) (*(const vf *)(p))
#define STORE(p, v) (*(vf *)(p) = (v))

/* Vectors of key positions a score kernel takes at a time for REP query heads: REP x NB independent
 * sums (8-14) hide the FMA latency, where one vector's REP sums alone (3 for SmolLM2) waited on it. */
#define NB(REP) ((REP) == 1 ? 8 : (REP) == 2 ? 4 : (REP) == 3 ? 3 : (REP) <= 7 ? 2 : 1)

/* Scores of NBV vectors of positions from vector v on (inside scores_REP_D). */
#define SCORE_BLOCK(REP, D, NBV)                                                                        \
    do {                                                                                                \
        vf acc[REP][NBV];                                                                              \
        for (int i = 0; i < REP; i++)                                                                   \
            for (int j = 0; j < NBV; j++) acc[i][j] = (vf){0};                                         \
        for (int d = 0; d < D; d++) {                                                                   \
            const float *k = keys + (size_t)d * stride + (size_t)v * vstride;                          \
            vf kv[NBV];                                                                                 \
            for (int j = 0; j < NBV; j++) kv[j] = LOAD(k + j * vstride);                               \
            for (int i = 0; i < REP; i++) {                                                             \
                const float qi = q[i * D + d]; /* a broadcast load (vf){0} + qi would add first */      \
                for (int j = 0; j < NBV; j++) acc[i][j] += qi * kv[j];                                  \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < REP; i++)                                                                   \
            for (int j = 0; j < NBV; j++) {                                                             \
                vf s = acc[i][j];                                                                       \
                if (bias) s += LOAD(bias + (size_t)(v + j) * VL);                                       \
                STORE(out + (size_t)i * W + (size_t)(v + j) * VL, s);                                   \
            }                                                                                           \
    } while (0)

/* q · keys at positions 0..n-1 rounded up to whole vectors, keys transposed: the vector of positions
 * v·VL.. at head dimension d at keys + d * stride + v * vstride ([D, L] for a prompt: stride L,
 * vstride VL; blocked [., D, VL] for a response: stride VL, vstride D VL); the REP query heads of q
 * [REP, D]; adds bias[l] when given; writes out[i * W + l]. */
#define SCORES(REP, D)                                                                                  \
    static void scores_##REP##_##D(const float *q, const float *keys, size_t stride, size_t vstride, int n, \
                                   const float *bias, float *out, int W) {                             \
        const int nv = (n + VL - 1) / VL;                                                               \
        int v = 0;                                                                                      \
        for (; v + NB(REP) <= nv; v += NB(REP)) SCORE_BLOCK(REP, D, NB(REP));                           \
        if (NB(REP) > 2 && v + 2 <= nv) { /* two left: both at once (twice the independent sums) */   \
            SCORE_BLOCK(REP, D, 2);                                                                     \
            v += 2;                                                                                     \
        }                                                                                               \
        for (; v < nv; v++) SCORE_BLOCK(REP, D, 1);                                                     \
    }

/* out[i, :] (+)= sum over l < n of w[i * W + l] * values[l, :] for values [n, D]. */
#define VALUES(REP, D)                                                                                  \
    static void values_##REP##_##D(const float *w, int W, const float *values, int n, float *out,      \
                                   int accumulate) {                                                    \
        vf acc[REP][D / VL];                                                                           \
        for (int i = 0; i < REP; i++)                                                                   \
            for (int j = 0; j < D / VL; j++) acc[i][j] = accumulate ? LOAD(out + i * D + VL * j) : (vf){0}; \
        for (int l = 0; l < n; l++) {                                                                   \
            const float *v = values + (size_t)l * D;                                                    \
            for (int j = 0; j < D / VL; j++) {                                                          \
                vf x = LOAD(v + VL * j);                                                               \
                for (int i = 0; i < REP; i++) acc[i][j] += w[(size_t)i * W + l] * x;                    \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < REP; i++)                                                                   \
            for (int j = 0; j < D / VL; j++) STORE(out + i * D + VL * j, acc[i][j]);                    \
    }

#define KERNELS(D) SCORES(1, D) SCORES(2, D) SCORES(3, D) SCORES(4, D) SCORES(5, D) SCORES(6, D) \
    SCORES(7, D) SCORES(8, D) VALUES(1, D) VALUES(2, D) VALUES(3, D) VALUES(4, D) VALUES(5, D)    \
    VALUES(6, D) VALUES(7, D) VALUES(8, D)
KERNELS(64)
KERNELS(128)

/* Products: y[m, n] for MC rows (MC <= 16) of x and one panel [K, VL] of W^T, into acc. x is k-major,
 * [K, MC] (see xt_at): the MC broadcasts of one k come from one cache line at fixed offsets, where
 * rows [MC, K] needed MC address registers (GCC spilled them to vector registers). The weights are
 * prefetched 256 vectors (16 KB) ahead, non-temporal (prefetchnta): the weights a step streams then
 * do not evict the caches' other data (activations, the prompts' keys and values). Both measured
 * in benchmarks/NOTES.md. */
#define PANEL(MC)                                                                                       \
    static void panel_##MC(const float *x, int K, const float *w, vf *acc) {                           \
        vf a[MC];                                                                                       \
        for (int m = 0; m < MC; m++) a[m] = (vf){0};                                                    \
        for (int k = 0; k < K; k++) {                                                                   \
            __builtin_prefetch(w + (size_t)(k + 256) * VL, 0, 0);                                       \
            vf b = LOAD(w + (size_t)k * VL);                                                            \
            for (int m = 0; m < MC; m++) a[m] += x[(size_t)k * MC + m] * b;                             \
        }                                                                                               \
        for (int m = 0; m < MC; m++) acc[m] = a[m];                                                     \
    }
#define ROWS_MAX 16

/* Where element (m, k) of a product's input x [M, K] lives in its k-major layout: rows in chunks of
 * ROWS_MAX, each chunk [K, rows in it] (for M <= 16 simply [K, M]), chunk after chunk. */
static inline size_t xt_at(int m, int k, int M, int K) {
    const int m0 = m / ROWS_MAX * ROWS_MAX, rows = M - m0 < ROWS_MAX ? M - m0 : ROWS_MAX;
    return (size_t)m0 * K + (size_t)k * rows + (m - m0);
}
PANEL(1) PANEL(2) PANEL(3) PANEL(4) PANEL(5) PANEL(6) PANEL(7) PANEL(8)
PANEL(9) PANEL(10) PANEL(11) PANEL(12) PANEL(13) PANEL(14) PANEL(15) PANEL(16)
typedef void (*panel_fn)(const float *, int, const float *, vf *);
static const panel_fn PANELS[ROWS_MAX + 1] = {0, panel_1, panel_2, panel_3, panel_4, panel_5, panel_6, panel_7,
    panel_8, panel_9, panel_10, panel_11, panel_12, panel_13, panel_14, panel_15, panel_16};


typedef int32_t vi __attribute__((vector_size(VL * 4), aligned(4)));

static inline vf splat(float a) { return (vf){0} + a; }
/* a where the mask is set (all ones), else b (GCC's vector ?: is C++ only). */
static inline vf vselect(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* exp(x) within 2 ulp for x in [-87.3, 88] (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in
 * r); exactly 0 below -87.3 (-inf gives 0, as a softmax over a padding bias needs), 2^127-ish above 88. */
static inline vf vexp(vf x) {
    const vi under = x < splat(-87.3365447504f);
    x = vselect(under, splat(0), vselect(x > splat(88.0f), splat(88.0f), x));
    vf n = x * 1.44269504088896341f;
    n = (n + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 pushes the fraction out */
    const vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const vf y = p * r * r + r + 1.0f;
    const vi scale = (__builtin_convertvector(n, vi) + 127) << 23; /* 2^n as a float's bits */
    return vselect(under, splat(0), y * (vf)scale);
}

/* The first `cols` lanes from p (the rest 0); `cols` lanes of v to p. */
static inline vf get(const float *p, int cols) {
    if (cols == VL) return LOAD(p);
    float tile[VL] = {0};
    memcpy(tile, p, sizeof(float) * cols);
    return LOAD(tile);
}
static inline void put(float *p, vf v, int cols) {
    if (cols == VL) {
        STORE(p, v);
        return;
    }
    float tile[VL];
    STORE(tile, v);
    memcpy(p, tile, sizeof(float) * cols);
}

/* The largest lane of v; the lanes' sum (in lane order). */
static inline float hmax(vf v) {
    float m = -__builtin_inff();
    for (int i = 0; i < VL; i++) m = v[i] > m ? v[i] : m;
    return m;
}
static inline float hsum(vf v) {
    float total = 0;
    for (int i = 0; i < VL; i++) total += v[i];
    return total;
}

int lean_vector_width(void) { return VL; }

/* y = exp(x) by the kernels' vexp, for n floats (the tests check it against torch.exp). */
void lean_exp(const float *x, int n, float *y) {
    for (int l = 0; l < n; l += VL) {
        const int cols = n - l < VL ? n - l : VL;
        put(y + l, vexp(get(x + l, cols)), cols);
    }
}

/* y [M, N] = x [M, K] W^T + bias (may be 0), then op 0: as is; 1: + other; 2: * other (other [M, N],
 * may be y itself). x k-major (xt_at), y and other row-major. W in panels [ceil(N / VL), K, VL], the
 * last one zero-padded. Rows beyond 16 go 16 at a time through each panel, which is then read from
 * cache. A work-shared loop over the panels: call it from inside a parallel region (all threads),
 * or from one thread alone. */
static void product(const float *x, int M, int K, const float *w, int N, const float *bias, int op,
                    const float *other, float *y) {
    const int panels = (N + VL - 1) / VL;
#pragma omp for schedule(static)
    for (int j = 0; j < panels; j++) {
        const int n0 = j * VL, cols = N - n0 < VL ? N - n0 : VL;
        const vf b = bias ? get(bias + n0, cols) : (vf){0};
        for (int m0 = 0; m0 < M; m0 += ROWS_MAX) {
            const int rows = M - m0 < ROWS_MAX ? M - m0 : ROWS_MAX;
            vf acc[ROWS_MAX];
            PANELS[rows](x + (size_t)m0 * K, K, w + (size_t)j * K * VL, acc);
            for (int m = 0; m < rows; m++) {
                const size_t at = (size_t)(m0 + m) * N + n0;
                vf v = acc[m] + b;
                if (op == 1) v += get(other + at, cols);
                if (op == 2) v *= get(other + at, cols);
                put(y + at, v, cols);
            }
        }
    }
}

/* y [M, N] = silu(x Wg^T + bg) * (x Wu^T + bu): a panel of the gate and the same panel of up, then
 * the product of their tiles (biases may be 0). x and y k-major (y is the next product's input).
 * Work-shared like product(). */
static void gated(const float *x, int M, int K, const float *wg, const float *bg, const float *wu,
                  const float *bu, int N, float *y) {
    const int panels = (N + VL - 1) / VL;
#pragma omp for schedule(static)
    for (int j = 0; j < panels; j++) {
        const int n0 = j * VL, cols = N - n0 < VL ? N - n0 : VL;
        const vf gb = bg ? get(bg + n0, cols) : (vf){0}, ub = bu ? get(bu + n0, cols) : (vf){0};
        for (int m0 = 0; m0 < M; m0 += ROWS_MAX) {
            const int rows = M - m0 < ROWS_MAX ? M - m0 : ROWS_MAX;
            vf gate[ROWS_MAX], up[ROWS_MAX];
            PANELS[rows](x + (size_t)m0 * K, K, wg + (size_t)j * K * VL, gate);
            PANELS[rows](x + (size_t)m0 * K, K, wu + (size_t)j * K * VL, up);
            for (int m = 0; m < rows; m++) {
                const vf g = gate[m] + gb;
                const vf v = g / (1.0f + vexp(-g)) * (up[m] + ub);
                float *at = y + xt_at(m0 + m, n0, M, N);
                for (int i = 0; i < cols; i++) at[(size_t)i * rows] = v[i];
            }
        }
    }
}

/* y = x [M, K] in the k-major layout, or with w and scale given w[k] * (x[m, k] * scale[m]) (the
 * RMSNorm's last step). Work-shared over columns: a k-major cache line holds one column of 16 rows,
 * which threads sharing the rows would both write. */
static void to_kmajor(const float *x, int M, int K, const float *w, const float *scale, float *y) {
#pragma omp for schedule(static)
    for (int k0 = 0; k0 < K; k0 += VL)
        for (int m0 = 0; m0 < M; m0 += ROWS_MAX) {
            const int rows = M - m0 < ROWS_MAX ? M - m0 : ROWS_MAX;
            float *out = y + (size_t)m0 * K;
            for (int k = k0; k < k0 + VL && k < K; k++)
                for (int m = m0; m < m0 + rows; m++) {
                    const float v = x[(size_t)m * K + k];
                    out[(size_t)k * rows + m - m0] = w ? w[k] * (v * scale[m]) : v;
                }
        }
}

/* y = w * (x * rsqrt(mean(x^2) + eps)) per row of x [M, K] (the Llama / Qwen2 RMSNorm), y k-major (a
 * product's input). Every thread takes all rows' scales (sums of squares in vectors), then its share
 * of the columns (to_kmajor). */
static void rms_norm(const float *x, int M, int K, const float *w, float eps, float *y) {
    float scale[M];
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * K;
        vf ss = {0};
        for (int k = 0; k < K; k += VL) {
            const vf v = get(xr + k, K - k < VL ? K - k : VL);
            ss += v * v;
        }
        scale[m] = 1.0f / __builtin_sqrtf(hsum(ss) / K + eps);
    }
    to_kmajor(x, M, K, w, scale, y);
}

/* s[0..n) = exp(s - max(s)) in place, n a multiple of VL; returns their sum. */
static float softmax_numerators(float *s, int n) {
    vf mv = splat(-__builtin_inff());
    for (int l = 0; l < n; l += VL) {
        const vf v = LOAD(s + l);
        mv = vselect(v > mv, v, mv);
    }
    const float mx = hmax(mv);
    vf sum = {0};
    for (int l = 0; l < n; l += VL) {
        const vf e = vexp(LOAD(s + l) - mx);
        STORE(s + l, e);
        sum += e;
    }
    return hsum(sum);
}

typedef void (*scores_fn)(const float *, const float *, size_t, size_t, int, const float *, float *, int);
typedef void (*values_fn)(const float *, int, const float *, int, float *, int);

/* The kernels for rep query heads per key/value head of size D: 1, or 0 where this file has none. */
static int pick(int rep, int D, scores_fn *score, values_fn *combine) {
    if (D != 64 && D != 128) return 0;
#define CASE(R)                                                                                         \
    case R:                                                                                             \
        *score = D == 64 ? scores_##R##_64 : scores_##R##_128;                                          \
        *combine = D == 64 ? values_##R##_64 : values_##R##_128;                                        \
        return 1;
    switch (rep) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) }
#undef CASE
    return 0;
}

/* Which (rep, D) this file has kernels for: 1 when supported. */
int cascade_supports(int rep, int D) {
    scores_fn s;
    values_fn v;
    return pick(rep, D, &s, &v);
}

/* Element d of head x [D] rotated by the rotary tables c, s: x·cos + rotate_half(x)·sin. */
static inline float rotary(const float *x, const float *c, const float *s, int d, int half) {
    const float rot = d < half ? -x[d + half] : x[d - half];
    return x[d] * c[d] + rot * s[d];
}

/* One (row r, key/value head h) pair of a layer's attention: rotary on its rep query heads (scaled by
 * `scale`) and its key, key and value stored at response position t, the scores over the prompt
 * (with its bias; L a multiple of VL) and response positions 0..t (rounded up to whole vectors: cap
 * is a multiple of VL) into sc [rep, W], their softmax, and
 * out [rep, D] = softmax · [prompt values; response values 0..t]. */
static void attend(int r, int h, const float *qkv, const float *cos, const float *sin, float scale, float *keys_t,
                   float *values, const float *prompt_kt, const float *prompt_v, const float *bias,
                   const int64_t *prompt, const int64_t *cache_row, int H, int KV, int D, int L, int cap, int t, scores_fn score,
                   values_fn combine, float *sc, float *out) {
    const int rep = H / KV, half = D / 2, own = (t + VL) / VL * VL, W = L + own;
    const float *row = qkv + (size_t)r * (H + 2 * KV) * D, *c = cos + (size_t)r * D, *s = sin + (size_t)r * D;
    float q[8 * 128];
    for (int i = 0; i < rep; i++) {
        const float *x = row + (size_t)(h * rep + i) * D;
        for (int d = 0; d < D; d++) q[i * D + d] = rotary(x, c, s, d, half) * scale;
    }
    const float *k = row + (size_t)(H + h) * D, *v = row + (size_t)(H + KV + h) * D;
    const size_t own_kv = (size_t)cache_row[r] * KV + h;
    float *kt = keys_t + own_kv * D * cap, *vt = values + own_kv * cap * D;
    for (int d = 0; d < D; d++) kt[(size_t)(t / VL) * D * VL + (size_t)d * VL + t % VL] = rotary(k, c, s, d, half);
    memcpy(vt + (size_t)t * D, v, sizeof(float) * D);
    const int64_t p = prompt[r];
    score(q, prompt_kt + ((size_t)p * KV + h) * D * L, L, VL, L, bias + (size_t)p * L, sc, W);
    score(q, kt, VL, (size_t)D * VL, t + 1, 0, sc + L, W);
    for (int i = 0; i < rep; i++) /* the positions past t in the last vector take no attention */
        for (int l = t + 1; l < own; l++) sc[(size_t)i * W + L + l] = -__builtin_inff();
    float inv[8];
    for (int i = 0; i < rep; i++) inv[i] = 1.0f / softmax_numerators(sc + (size_t)i * W, W);
    combine(sc, W, prompt_v + ((size_t)p * KV + h) * L * D, L, out, 0);
    combine(sc + L, W, vt, t + 1, out, 1);
    for (int i = 0; i < rep; i++)
        for (int d = 0; d < D; d += VL) STORE(out + i * D + d, LOAD(out + i * D + d) * inv[i]);
}

/* For lean_pick's float64 sums: half as many doubles in a vector of the same width, a float
 * vector's lower and upper halves, and each lane's index (to mask a partial vector). */
typedef double vd __attribute__((vector_size(VL * 4)));
typedef float vh __attribute__((vector_size(VL * 2)));
/* A float vector's lower and upper halves (memcpy, not __builtin_shufflevector: GCC before 12 lacks it). */
static inline vh low_half(vf v) {
    vh h;
    memcpy(&h, &v, sizeof h);
    return h;
}
static inline vh high_half(vf v) {
    vh h;
    memcpy(&h, (const char *)&v + sizeof h, sizeof h);
    return h;
}
#if VL == 16
#define LANES {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
#else
#define LANES {0, 1, 2, 3, 4, 5, 6, 7}
#endif

/* `cols` logits from p divided by the temperature T (as transformers' warper divides: z / T). */
static inline vf scaled(const float *p, int cols, float T) {
    const vf v = get(p, cols);
    return T != 1.0f ? v / T : v;
}

/* The sampled token of each of b rows, by inverse CDF as rollout/sampling.py's inverse_cdf: with
 * z = logits / T (float32, as transformers' temperature warper divides) and w = exp(z - max z), the
 * first token v with CDF(v) > u * CDF(V), CDF the cumsum of w in float64 taken in two levels (block
 * sums of `block` tokens, then the chosen block's own cumsum). logits [b, V] float32, u [b] in [0, 1);
 * out [b]. Rows in parallel. w is exp by vexp (within 2 ulp of torch.exp), so a target within a few
 * ulp of a CDF step could pick the neighbouring token (tests/cpu/test_lean.py: none in 30,000 draws).
 * A row whose weights do not sum to a positive number (a NaN logit, or all -inf) gets -1.
 * moments: NULL, or [b, 2] that get each row's S = sum of w and E = sum of w * (z - max z) in float64,
 * from the same pass: the entropy of softmax(z) is log S - E / S (a -inf logit adds nothing to E). */
void lean_pick(const float *logits, int b, int V, float T, const double *u, int block, int64_t *out,
               double *moments) {
    const vi lanes = LANES;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < b; r++) {
        const float *z = logits + (size_t)r * V;
        const int nb = (V + block - 1) / block;
        double csum[nb];
        vf mv = splat(-__builtin_inff());
        for (int l = 0; l < V; l += VL) {
            const int cols = V - l < VL ? V - l : VL;
            const vf v = vselect(lanes < cols, scaled(z + l, cols, T), splat(-__builtin_inff()));
            mv = vselect(v > mv, v, mv);
        }
        const float mx = hmax(mv);
        double run = 0;
        vd elo = {0}, ehi = {0};
        for (int k = 0; k < nb; k++) { /* block is a multiple of VL */
            vd lo = {0}, hi = {0};
            for (int l = k * block; l < (k + 1) * block && l < V; l += VL) {
                const int cols = V - l < VL ? V - l : VL;
                const vf d = scaled(z + l, cols, T) - mx;
                const vf w = vselect(lanes < cols, vexp(d), splat(0));
                lo += __builtin_convertvector(low_half(w), vd);
                hi += __builtin_convertvector(high_half(w), vd);
                if (moments) {
                    const vf wd = vselect(w > 0, w * d, splat(0));
                    elo += __builtin_convertvector(low_half(wd), vd);
                    ehi += __builtin_convertvector(high_half(wd), vd);
                }
            }
            double s = 0;
            for (int i = 0; i < VL / 2; i++) s += lo[i] + hi[i];
            csum[k] = run += s;
        }
        if (moments) {
            double e = 0;
            for (int i = 0; i < VL / 2; i++) e += elo[i] + ehi[i];
            moments[2 * r] = run;
            moments[2 * r + 1] = e;
        }
        if (!(csum[nb - 1] > 0)) { /* a NaN logit, or every logit -inf: nothing to sample */
            out[r] = -1;
            continue;
        }
        const double target = u[r] * csum[nb - 1];
        int k = 0;
        while (k < nb - 1 && !(csum[k] > target)) k++;
        const double rest = target - (k > 0 ? csum[k - 1] : 0.0);
        const int n = V - k * block < block ? V - k * block : block;
        double inner[block];
        run = 0;
        for (int l = 0; l < n; l += VL) {
            const int cols = n - l < VL ? n - l : VL;
            const vf w = vexp(scaled(z + (size_t)k * block + l, cols, T) - mx);
            for (int i = 0; i < cols; i++) inner[l + i] = run += w[i];
        }
        for (int l = n; l < block; l++) inner[l] = run; /* the padding (weight 0) */
        int j = 0, last = 0;
        while (j < block && !(inner[j] > rest)) j++;
        while (last < block && inner[last] < inner[block - 1]) last++;
        const int64_t tok = (int64_t)k * block + (j < last ? j : last);
        out[r] = tok < V - 1 ? tok : V - 1;
    }
}

/* Rows [row0, row0 + n) of a matrix W [N, K] stacked from parts (w: those rows, [n, K]) into W's
 * panels [ceil(N / VL), K, VL] (out, 64-byte aligned; the caller zeroes a partial last panel's
 * padding). Panels in parallel. A panel that this call fills whole is written with non-temporal
 * stores, one vector per k: no read of the old panels, which halves the memory traffic. */
void lean_panels(const float *w, int n, int K, int row0, float *out) {
    const int first = row0 / VL, end = (row0 + n + VL - 1) / VL;
#pragma omp parallel for schedule(static)
    for (int p = first; p < end; p++) {
        const int r0 = p * VL > row0 ? p * VL : row0, r1 = (p + 1) * VL < row0 + n ? (p + 1) * VL : row0 + n;
        float *o = out + (size_t)p * K * VL;
        if (r1 - r0 < VL) { /* a panel shared with another part, or the last one */
            for (int r = r0; r < r1; r++)
                for (int k = 0; k < K; k++) o[(size_t)k * VL + r % VL] = w[(size_t)(r - row0) * K + k];
            continue;
        }
        const float *src = w + (size_t)(r0 - row0) * K;
        for (int k = 0; k < K; k++) {
            float col[VL] __attribute__((aligned(64)));
            for (int i = 0; i < VL; i++) col[i] = src[(size_t)i * K + k];
            STREAM(o + (size_t)k * VL, col);
        }
    }
#if defined(__SSE__)
    _mm_sfence(); /* the streamed stores are seen before the step reads the panels */
#endif
}

/* y [M, N] = x W^T + bias, then op (see product()), on all threads; x row-major [M, K], copied to
 * the k-major layout in xt (M K floats) first. */
void lean_linear(const float *x, int M, int K, const float *w, int N, const float *bias, int op,
                 const float *other, float *xt, float *y) {
#pragma omp parallel
    {
        to_kmajor(x, M, K, 0, 0, xt);
        product(xt, M, K, w, N, bias, op, other, y);
    }
}

/* Per layer, the addresses lean_step reads (0 for a bias the model does not have): norms' weights,
 * products' panels and biases, and the layer's cache. */
enum { LN_ATTN, QKV, QKV_BIAS, O, O_BIAS, LN_MLP, GATE, GATE_BIAS, UP, UP_BIAS, DOWN, DOWN_BIAS,
       KEYS_T, VALUES, PROMPT_KT, PROMPT_V, SLOTS };

int lean_step_slots(void) { return SLOTS; }

/* Floats of scratch lean_step needs for b rows at response position t. */
size_t lean_step_work(int b, int hidden, int inter, int H, int KV, int D, int L, int t) {
    const size_t W = L + (t + VL) / VL * VL;
    return (size_t)b * (hidden + (size_t)(H + 2 * KV) * D + 2 * (size_t)H * D + inter + (size_t)H * W);
}

#define AT(p) ((float *)(intptr_t)(p))

/* One decode step of b live rows: x [b, hidden] (the tokens' embeddings, overwritten by the residual
 * stream), cos / sin [b, D] at their positions; logits [b, vocab]. layers [n_layers, SLOTS]
 * (the enum above); the layers' caches get this step's keys and values at response position t.
 * work: lean_step_work() floats. Returns 0, or -1 (nothing computed) for an attention shape this
 * file has no kernel for (cascade_supports) or a size that cannot be right. */
int lean_step(const int64_t *layers, int n_layers, int hidden, int inter, int vocab, int H, int KV, int D,
               float eps, float scale, const float *final_norm, const float *head, const float *head_bias,
               const float *bias, const int64_t *prompt, const int64_t *cache_row, int L, int cap, int t, int b, const float *cos,
               const float *sin, float *x, float *work, float *logits) {
    const int rep = H / KV, W = L + (t + VL) / VL * VL, nqkv = (H + 2 * KV) * D;
    scores_fn score;
    values_fn combine;
    if (KV <= 0 || H % KV || !pick(rep, D, &score, &combine) || b <= 0 || n_layers <= 0 || L % VL || cap % VL || t < 0
        || t >= cap)
        return -1;
    float *h = work, *qkv = h + (size_t)b * hidden, *attn = qkv + (size_t)b * nqkv, *attn_t = attn + (size_t)b * H * D,
          *act = attn_t + (size_t)b * H * D, *sc = act + (size_t)b * inter;
#pragma omp parallel
    {
        for (int i = 0; i < n_layers; i++) {
            const int64_t *a = layers + (size_t)i * SLOTS;
            rms_norm(x, b, hidden, AT(a[LN_ATTN]), eps, h);
            product(h, b, hidden, AT(a[QKV]), nqkv, AT(a[QKV_BIAS]), 0, 0, qkv);
#pragma omp for collapse(2) schedule(static)
            for (int r = 0; r < b; r++)
                for (int g = 0; g < KV; g++)
                    attend(r, g, qkv, cos, sin, scale, AT(a[KEYS_T]), AT(a[VALUES]), AT(a[PROMPT_KT]),
                           AT(a[PROMPT_V]), bias, prompt, cache_row, H, KV, D, L, cap, t, score, combine,
                           sc + ((size_t)r * KV + g) * rep * W, attn + ((size_t)r * KV + g) * rep * D);
            if (b > 1) to_kmajor(attn, b, H * D, 0, 0, attn_t); /* one row: the layouts are the same */
            product(b > 1 ? attn_t : attn, b, H * D, AT(a[O]), hidden, AT(a[O_BIAS]), 1, x, x);
            rms_norm(x, b, hidden, AT(a[LN_MLP]), eps, h);
            gated(h, b, hidden, AT(a[GATE]), AT(a[GATE_BIAS]), AT(a[UP]), AT(a[UP_BIAS]), inter, act);
            product(act, b, inter, AT(a[DOWN]), hidden, AT(a[DOWN_BIAS]), 1, x, x);
        }
        rms_norm(x, b, hidden, final_norm, eps, h);
        product(h, b, hidden, head, vocab, head_bias, 0, 0, logits);
    }
    return 0;
}
