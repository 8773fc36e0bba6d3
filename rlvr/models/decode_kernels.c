/* Kernels of the lean decode step (rlvr/rollout/lean.py): its products and its attention over a
 * cascade cache.
 *
 * Compiled on the machine that runs it, at first use (rlvr/models/kernels.py: cc -O3 -march=native
 * -fopenmp), and called through ctypes with the tensors' data pointers. OpenMP shares torch's runtime
 * (libgomp.so.1, already loaded), so the thread count is torch's.
 *
 * Products (lean_linear): y = x W^T + bias, then + or * another tensor, for the few rows of a decode
 * step. W is stored in panels of VL output columns, [ceil(N / VL), K, VL], each read once from
 * memory front to back (prefetched ahead) while up to 16 rows accumulate in registers: the weight
 * stream and the arithmetic overlap, which oneDNN's prepacked product does not manage at 8-16 rows.
 *
 * Attention (cascade_scores, cascade_values), float32, contiguous; b live rows, H query heads, KV
 * key/value heads, rep = H / KV:
 *   qkv      [b, (H + 2 KV) D]    the [q; k; v] product of the step's token, before rotary
 *   cos, sin [b, D]               the rotary tables at each row's position
 *   keys_t   [rows, KV, D, cap]   the rows' response keys, transposed (position last)
 *   values   [rows, KV, cap, D]   the rows' response values
 *   prompt_kt [P, KV, D, L]       the prompts' keys, transposed; prompt_v [P, KV, L, D]
 *   bias     [P, L]               0, or -inf on a prompt's left padding
 *   prompt   [b]                  the prompt each live row samples from
 *   scores   [b, KV, rep, L + t + 1]; out [b, KV, rep, D]
 *
 * Live row r keeps its response at index r of keys_t / values (the cache moves rows to the front
 * when others finish), so each (row, key/value head) pair writes only its own slots: the pairs run
 * in parallel without locks.
 *
 * Vectors are GCC's vector extension, as wide as the CPU's (VL floats). A score is accumulated in
 * the lane of its key position (keys transposed), so no horizontal sums are needed; an output row in
 * D / VL registers per query head. Results differ from torch's products, bmm and softmax by float
 * rounding (the order of the sums).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The CPU's vector width: 16 floats with AVX-512, else 8 (AVX2; GCC splits wider generic vectors badly:
 * 64-byte vectors built for AVX2 ran the whole rollout 1.5x slower). */
#if defined(__AVX512F__)
#define VL 16
#else
#define VL 8
#endif
typedef float vf __attribute__((vector_size(VL * 4), aligned(4)));

#define LOAD(p) (*(const vf *)(p))
#define STORE(p, v) (*(vf *)(p) = (v))

/* q · keys for keys [D, stride] (position last) at positions 0..n-1, the REP query heads of q [REP, D];
 * adds bias[l] when bias is given; writes out[i * W + l]. */
#define SCORES(REP, D)                                                                                  \
    static void scores_##REP##_##D(const float *q, const float *keys, size_t stride, int n,            \
                                   const float *bias, float *out, int W) {                             \
        int l = 0;                                                                                      \
        for (; l + VL <= n; l += VL) {                                                                  \
            vf acc[REP];                                                                               \
            for (int i = 0; i < REP; i++) acc[i] = (vf){0};                                            \
            for (int d = 0; d < D; d++) {                                                               \
                vf k = LOAD(keys + (size_t)d * stride + l);                                            \
                for (int i = 0; i < REP; i++) acc[i] += q[i * D + d] * k;                               \
            }                                                                                           \
            for (int i = 0; i < REP; i++) {                                                             \
                if (bias) acc[i] += LOAD(bias + l);                                                     \
                STORE(out + (size_t)i * W + l, acc[i]);                                                 \
            }                                                                                           \
        }                                                                                               \
        for (; l < n; l++) {                                                                            \
            for (int i = 0; i < REP; i++) {                                                             \
                float s = 0;                                                                            \
                for (int d = 0; d < D; d++) s += q[i * D + d] * keys[(size_t)d * stride + l];           \
                out[(size_t)i * W + l] = bias ? s + bias[l] : s;                                        \
            }                                                                                           \
        }                                                                                               \
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

typedef void (*scores_fn)(const float *, const float *, size_t, int, const float *, float *, int);
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

/* Rotary on the row's q and k heads (q scaled by `scale`), k and v stored at response position t,
 * then the scores of the rep query heads of each key/value head over the prompt (with its bias)
 * and the response positions 0..t. */
void cascade_scores(const float *qkv, const float *cos, const float *sin, float scale, float *keys_t,
                    float *values, const float *prompt_kt, const float *bias, const int64_t *prompt,
                    int b, int H, int KV, int D, int L, int cap, int t, float *scores) {
    const int rep = H / KV, W = L + t + 1, half = D / 2;
    scores_fn score;
    values_fn unused;
    pick(rep, D, &score, &unused);
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < b; r++) {
        for (int h = 0; h < KV; h++) {
            const float *row = qkv + (size_t)r * (H + 2 * KV) * D, *c = cos + (size_t)r * D, *s = sin + (size_t)r * D;
            float q[8 * 128];
            for (int i = 0; i < rep; i++) {
                const float *x = row + (size_t)(h * rep + i) * D;
                for (int d = 0; d < D; d++) {
                    float rot = d < half ? -x[d + half] : x[d - half];
                    q[i * D + d] = (x[d] * c[d] + rot * s[d]) * scale;
                }
            }
            const float *k = row + (size_t)(H + h) * D, *v = row + (size_t)(H + KV + h) * D;
            float *kt = keys_t + ((size_t)r * KV + h) * D * cap;
            for (int d = 0; d < D; d++) {
                float rot = d < half ? -k[d + half] : k[d - half];
                kt[(size_t)d * cap + t] = k[d] * c[d] + rot * s[d];
            }
            float *vv = values + (((size_t)r * KV + h) * cap + t) * D;
            memcpy(vv, v, sizeof(float) * D);
            const int64_t p = prompt[r];
            float *out = scores + ((size_t)r * KV + h) * rep * W;
            score(q, prompt_kt + ((size_t)p * KV + h) * D * L, L, L, bias + (size_t)p * L, out, W);
            score(q, kt, cap, t + 1, 0, out + L, W);
        }
    }
}

/* out = weights · [prompt values; the row's response values 0..t]; weights [b, KV, rep, L + t + 1]. */
void cascade_values(const float *weights, const float *prompt_v, const float *values, const int64_t *prompt,
                    int b, int H, int KV, int D, int L, int cap, int t, float *out) {
    const int rep = H / KV, W = L + t + 1;
    scores_fn unused;
    values_fn combine;
    pick(rep, D, &unused, &combine);
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < b; r++) {
        for (int h = 0; h < KV; h++) {
            const int64_t p = prompt[r];
            const float *w = weights + ((size_t)r * KV + h) * rep * W;
            float *o = out + ((size_t)r * KV + h) * rep * D;
            combine(w, W, prompt_v + ((size_t)p * KV + h) * L * D, L, o, 0);
            combine(w + L, W, values + ((size_t)r * KV + h) * cap * D, t + 1, o, 1);
        }
    }
}

/* Products: y[m, n] for MC rows (MC <= 16) of x [.., K] and one panel [K, VL] of W^T, into acc. */
#define PANEL(MC)                                                                                       \
    static void panel_##MC(const float *x, int K, const float *w, vf *acc) {                           \
        vf a[MC];                                                                                       \
        for (int m = 0; m < MC; m++) a[m] = (vf){0};                                                    \
        for (int k = 0; k < K; k++) {                                                                   \
            __builtin_prefetch(w + (size_t)(k + 64) * VL);                                              \
            vf b = LOAD(w + (size_t)k * VL);                                                            \
            for (int m = 0; m < MC; m++) a[m] += x[(size_t)m * K + k] * b;                              \
        }                                                                                               \
        for (int m = 0; m < MC; m++) acc[m] = a[m];                                                     \
    }
#define ROWS_MAX 16
PANEL(1) PANEL(2) PANEL(3) PANEL(4) PANEL(5) PANEL(6) PANEL(7) PANEL(8)
PANEL(9) PANEL(10) PANEL(11) PANEL(12) PANEL(13) PANEL(14) PANEL(15) PANEL(16)
typedef void (*panel_fn)(const float *, int, const float *, vf *);
static const panel_fn PANELS[ROWS_MAX + 1] = {0, panel_1, panel_2, panel_3, panel_4, panel_5, panel_6, panel_7,
    panel_8, panel_9, panel_10, panel_11, panel_12, panel_13, panel_14, panel_15, panel_16};

int lean_vector_width(void) { return VL; }

/* y [M, N] = x [M, K] W^T + bias (may be 0), then op 0: as is; 1: + other; 2: * other (other [M, N]).
 * W in panels [ceil(N / VL), K, VL], the last one zero-padded. Rows beyond 16 go 16 at a time through
 * each panel, which is then read from cache. */
void lean_linear(const float *x, int M, int K, const float *w, int N, const float *bias, int op,
                 const float *other, float *y) {
    const int panels = (N + VL - 1) / VL;
#pragma omp parallel for schedule(static)
    for (int j = 0; j < panels; j++) {
        const float *panel = w + (size_t)j * K * VL;
        const int n0 = j * VL, cols = N - n0 < VL ? N - n0 : VL;
        for (int m0 = 0; m0 < M; m0 += ROWS_MAX) {
            const int rows = M - m0 < ROWS_MAX ? M - m0 : ROWS_MAX;
            vf acc[ROWS_MAX];
            PANELS[rows](x + (size_t)m0 * K, K, panel, acc);
            for (int m = 0; m < rows; m++) {
                float tile[VL], *out = y + (size_t)(m0 + m) * N + n0;
                const float *o = other ? other + (size_t)(m0 + m) * N + n0 : 0;
                STORE(tile, acc[m]);
                for (int c = 0; c < cols; c++) {
                    const float v = bias ? tile[c] + bias[n0 + c] : tile[c];
                    out[c] = op == 1 ? v + o[c] : op == 2 ? v * o[c] : v;
                }
            }
        }
    }
}
