/* Decode and verification attention for emulated bf16 numerics, AVX2 + FMA (loaded by
 * toolaudit/engines/torch/kernel.py, which says why and when it runs).
 *
 * Numerics, per (row, key/value head) pair and independent of every other row, of the thread count and of
 * where the cache splits: scores are one FMA chain over the head dimension per (query row, column), rounded to
 * bf16; masked columns are skipped; the softmax is float32 (max, exp(score - max), sum, times 1/sum) with
 * probabilities rounded to bf16; the output is one FMA chain over all columns of both cache parts per (query
 * row, dimension), rounded to bf16. Rounding is round-to-nearest-even, as torch's float -> bfloat16 cast.
 * Compiled with -ffp-contract=off: the only fused operations are the explicit FMAs below.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline __m256 round_bf16(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
}

static inline __m256 exp_neg(__m256 x) { /* exp(x) for x <= 0 (Cephes' expf); 0 below -87.3 and for -inf */
    const __m256 lo = _mm256_set1_ps(-87.3365f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

typedef struct {
    const float *k, *v;      /* part base pointers */
    int64_t n, sb, sh;       /* columns; element strides of the row and head dimensions (column stride = D) */
} part_t;

/* One (row, kv head) pair. q: [R][D] scaled and rounded queries of this pair (r = g*Q + q). */
static void pair(const float *q, int R, int D, const part_t *parts, int nparts, const uint8_t *mask, int Q,
                 float post_scale, int64_t total, int64_t b, int64_t h, float *qt, float *S, uint8_t *any, float *out_rows) {
    const int R8 = (R + 7) & ~7, NV = R8 / 8;
    for (int d = 0; d < D; d++)
        for (int r = 0; r < R8; r++) qt[d * R8 + r] = r < R ? q[r * D + d] : 0.0f;
    for (int64_t c = 0; c < total; c++) {
        uint8_t a = 1;  /* 0: no query row attends, 1: every one does, 2: some do */
        if (mask) {
            int n = 0;
            for (int i = 0; i < Q; i++) n += mask[i * total + c] != 0;
            a = n == 0 ? 0 : n == Q ? 1 : 2;
        }
        any[c] = a;
    }
    /* scores S[c][r] = round(sum_d k[c][d] * qt[d][r]), one FMA chain over d per (c, r) */
    int64_t c0 = 0;
    for (int p = 0; p < nparts; p++) {
        const float *kp = parts[p].k + b * parts[p].sb + h * parts[p].sh;
        int64_t j8 = 0;
        if (NV == 1)
            for (; j8 + 8 <= parts[p].n; j8 += 8) {
                int live = 0;
                for (int x = 0; x < 8; x++) live |= any[c0 + j8 + x];
                if (!live) continue;
                const float *k0 = kp + j8 * D;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
                const float *qd = qt;
                for (int d = 0; d < D; d++, qd += 8) {
                    __m256 q0 = _mm256_loadu_ps(qd);
                    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + d), q0, a0);
                    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + D + d), q0, a1);
                    a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + 2 * D + d), q0, a2);
                    a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + 3 * D + d), q0, a3);
                    a4 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + 4 * D + d), q0, a4);
                    a5 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + 5 * D + d), q0, a5);
                    a6 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + 6 * D + d), q0, a6);
                    a7 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + 7 * D + d), q0, a7);
                }
                float *s = S + (c0 + j8) * 8;
                _mm256_storeu_ps(s, round_bf16(a0)); _mm256_storeu_ps(s + 8, round_bf16(a1));
                _mm256_storeu_ps(s + 16, round_bf16(a2)); _mm256_storeu_ps(s + 24, round_bf16(a3));
                _mm256_storeu_ps(s + 32, round_bf16(a4)); _mm256_storeu_ps(s + 40, round_bf16(a5));
                _mm256_storeu_ps(s + 48, round_bf16(a6)); _mm256_storeu_ps(s + 56, round_bf16(a7));
            }
        for (int64_t j = j8; j < parts[p].n; j += 4) {
            int cols = parts[p].n - j < 4 ? (int)(parts[p].n - j) : 4;
            int live = 0;
            for (int x = 0; x < cols; x++) live |= any[c0 + j + x];
            if (!live) continue;
            for (int rv = 0; rv < NV; rv += 3) {
                int nv = NV - rv < 3 ? NV - rv : 3;
                __m256 acc[4][3];
                for (int x = 0; x < 4; x++) for (int y = 0; y < 3; y++) acc[x][y] = _mm256_setzero_ps();
                const float *k0 = kp + j * D;
                if (cols == 4 && nv == 3) {
                    for (int d = 0; d < D; d++) {
                        const float *qd = qt + d * R8 + rv * 8;
                        __m256 q0 = _mm256_loadu_ps(qd), q1 = _mm256_loadu_ps(qd + 8), q2 = _mm256_loadu_ps(qd + 16);
                        for (int x = 0; x < 4; x++) {
                            __m256 kb = _mm256_broadcast_ss(k0 + x * D + d);
                            acc[x][0] = _mm256_fmadd_ps(kb, q0, acc[x][0]);
                            acc[x][1] = _mm256_fmadd_ps(kb, q1, acc[x][1]);
                            acc[x][2] = _mm256_fmadd_ps(kb, q2, acc[x][2]);
                        }
                    }
                } else if (nv == 1) {
                    for (int d = 0; d < D; d++) {
                        __m256 q0 = _mm256_loadu_ps(qt + d * R8 + rv * 8);
                        for (int x = 0; x < cols; x++)
                            acc[x][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + x * D + d), q0, acc[x][0]);
                    }
                } else {
                    for (int d = 0; d < D; d++)
                        for (int y = 0; y < nv; y++) {
                            __m256 qy = _mm256_loadu_ps(qt + d * R8 + (rv + y) * 8);
                            for (int x = 0; x < cols; x++)
                                acc[x][y] = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + x * D + d), qy, acc[x][y]);
                        }
                }
                for (int x = 0; x < cols; x++)
                    for (int y = 0; y < nv; y++)
                        _mm256_storeu_ps(S + (c0 + j + x) * R8 + (rv + y) * 8, round_bf16(acc[x][y]));
            }
        }
        c0 += parts[p].n;
    }
    /* mask, softmax over columns per query row (lanes), probabilities rounded */
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int rv = 0; rv < NV; rv++) {
        __m256 top = ninf;
        const __m256 scale = _mm256_set1_ps(post_scale);
        for (int64_t c = 0; c < total; c++) {
            float *s = S + c * R8 + rv * 8;
            if (!any[c]) continue;
            if (post_scale != 1.0f) _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_loadu_ps(s), scale));
            if (any[c] == 2) {
                float m[8];
                for (int l = 0; l < 8; l++) {
                    int r = rv * 8 + l;
                    m[l] = (r < R && !mask[(r % Q) * total + c]) ? -INFINITY : 0.0f;
                }
                _mm256_storeu_ps(s, _mm256_add_ps(_mm256_loadu_ps(s), _mm256_loadu_ps(m)));
            }
            top = _mm256_max_ps(top, _mm256_loadu_ps(s));
        }
        __m256 shift = _mm256_blendv_ps(top, _mm256_setzero_ps(), _mm256_cmp_ps(top, ninf, _CMP_EQ_OQ));
        __m256 sum = _mm256_setzero_ps();
        for (int64_t c = 0; c < total; c++) {
            if (!any[c]) continue;
            float *s = S + c * R8 + rv * 8;
            __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s), shift));
            _mm256_storeu_ps(s, e);
            sum = _mm256_add_ps(sum, e);
        }
        __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), sum);
        for (int64_t c = 0; c < total; c++) {
            if (!any[c]) continue;
            float *s = S + c * R8 + rv * 8;
            _mm256_storeu_ps(s, round_bf16(_mm256_mul_ps(_mm256_loadu_ps(s), inv)));
        }
    }
    /* out[r][d] = round(sum_c S[c][r] * v[c][d]): one FMA chain over the columns of every part per (r, d) */
    for (int r0 = 0; r0 < R; r0 += 3) {
        int nr = R - r0 < 3 ? R - r0 : 3;
        for (int d0 = 0; d0 < D; d0 += 32) {
            if (d0 + 32 > D) { /* head_dim % 32 != 0: the last dims 8 at a time */
                for (int e = d0; e < D; e += 8) {
                    __m256 a[3] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                    int64_t c = 0;
                    for (int p = 0; p < nparts; p++) {
                        const float *vp = parts[p].v + b * parts[p].sb + h * parts[p].sh + e;
                        for (int64_t j = 0; j < parts[p].n; j++, c++) {
                            if (!any[c]) continue;
                            __m256 v0 = _mm256_loadu_ps(vp + j * D);
                            for (int x = 0; x < nr; x++)
                                a[x] = _mm256_fmadd_ps(_mm256_broadcast_ss(S + c * R8 + r0 + x), v0, a[x]);
                        }
                    }
                    for (int x = 0; x < nr; x++)
                        _mm256_storeu_ps(out_rows + (int64_t)(r0 + x) * D + e, round_bf16(a[x]));
                }
                break;
            }
            __m256 acc[3][4];
            for (int x = 0; x < 3; x++) for (int y = 0; y < 4; y++) acc[x][y] = _mm256_setzero_ps();
            int64_t c = 0;
            for (int p = 0; p < nparts; p++) {
                const float *vp = parts[p].v + b * parts[p].sb + h * parts[p].sh + d0;
                for (int64_t j = 0; j < parts[p].n; j++, c++) {
                    if (!any[c]) continue;
                    const float *vr = vp + j * D;
                    __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
                    __m256 v2 = _mm256_loadu_ps(vr + 16), v3 = _mm256_loadu_ps(vr + 24);
                    for (int x = 0; x < nr; x++) {
                        __m256 pb = _mm256_broadcast_ss(S + c * R8 + r0 + x);
                        acc[x][0] = _mm256_fmadd_ps(pb, v0, acc[x][0]);
                        acc[x][1] = _mm256_fmadd_ps(pb, v1, acc[x][1]);
                        acc[x][2] = _mm256_fmadd_ps(pb, v2, acc[x][2]);
                        acc[x][3] = _mm256_fmadd_ps(pb, v3, acc[x][3]);
                    }
                }
            }
            for (int x = 0; x < nr; x++)
                for (int y = 0; y < 4; y++)
                    _mm256_storeu_ps(out_rows + (int64_t)(r0 + x) * D + d0 + y * 8, round_bf16(acc[x][y]));
        }
    }
}

/* Attention of B rows x Hkv key/value heads, G query heads per kv head, Q query positions, D (a multiple of 8) dims.
 * q: [B, Hkv, G*Q, D] contiguous, rounded to bf16 (and scaled, where the scale is a power of two: exact).
 * post_scale: 1, or the scale that multiplies the rounded scores in float32 (as torch's path does otherwise).
 * Parts (1 or 2): keys/values [B, Hkv, n, D] with column stride D. mask: [Bm, Q, total] (1 = attend) or NULL.
 * out: [B, Q, Hkv*G, D]. Returns 0, or -1 when out of memory. */
int ta_attention(const float *q, int64_t B, int64_t Hkv, int G, int Q, int D,
                 const float *k0, const float *v0, int64_t n0, int64_t sb0, int64_t sh0,
                 const float *k1, const float *v1, int64_t n1, int64_t sb1, int64_t sh1,
                 const uint8_t *mask, int64_t mask_rows, float post_scale, float *out) {
    part_t parts[2] = {{k0, v0, n0, sb0, sh0}, {k1, v1, n1, sb1, sh1}};
    int nparts = k1 ? 2 : 1;
    int64_t total = n0 + (k1 ? n1 : 0);
    const int R = G * Q, R8 = (R + 7) & ~7;
    int failed = 0;
#pragma omp parallel reduction(|:failed)
    {
        float *qt = malloc(sizeof(float) * D * R8);
        float *S = malloc(sizeof(float) * (total + 4) * R8);
        uint8_t *any = malloc(total + 1);
        float *rows = malloc(sizeof(float) * R * D);
        int ok = qt && S && any && rows;
        if (!ok) failed = 1;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < B * Hkv; i++) {
            if (ok) {
                int64_t b = i / Hkv, h = i % Hkv;
                const uint8_t *m = mask ? mask + (mask_rows == 1 ? 0 : b) * Q * total : NULL;
                pair(q + i * R * D, R, D, parts, nparts, m, Q, post_scale, total, b, h, qt, S, any, rows);
                for (int g = 0; g < G; g++)
                    for (int t = 0; t < Q; t++)
                        memcpy(out + ((b * Q + t) * Hkv * G + h * G + g) * D, rows + (g * Q + t) * D,
                               sizeof(float) * D);
            }
        }
        free(qt); free(S); free(any); free(rows);
    }
    return failed ? -1 : 0;
}
