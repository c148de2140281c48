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

/* dst[r][d] = sum over columns c in [cbeg, cend) with any[c] of S[c][r] * v[c][d], one FMA chain over the columns
 * (of every part, in order) per (r, d); float32, not rounded. */
static void pv(const float *S, int R, int D, const part_t *parts, int nparts, int64_t b, int64_t h,
               const uint8_t *any, int64_t cbeg, int64_t cend, float *dst) {
    const int R8 = (R + 7) & ~7;
    for (int r0 = 0; r0 < R; r0 += 3) {
        int nr = R - r0 < 3 ? R - r0 : 3;
        for (int d0 = 0; d0 < D; d0 += 32) {
            int wide = d0 + 32 <= D;  /* else head_dim % 32 != 0: the last dims 8 at a time */
            for (int e = d0; e < (wide ? d0 + 1 : D); e += 8) {
                __m256 acc[3][4];
                for (int x = 0; x < 3; x++) for (int y = 0; y < 4; y++) acc[x][y] = _mm256_setzero_ps();
                __m256 a00 = acc[0][0], a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
                __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
                int64_t c = 0;
                for (int p = 0; p < nparts; p++) {
                    int64_t lo = cbeg > c ? cbeg - c : 0, hi = cend - c < parts[p].n ? cend - c : parts[p].n;
                    const float *vp = parts[p].v + b * parts[p].sb + h * parts[p].sh + e;
                    for (int64_t j = lo; j < hi; j++) {
                        if (!any[c + j]) continue;
                        const float *vr = vp + j * D;
                        const float *sc = S + (c + j) * R8 + r0;
                        if (wide && nr == 3) { /* the common case, unrolled: twelve accumulators in registers */
                            __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
                            __m256 v2 = _mm256_loadu_ps(vr + 16), v3 = _mm256_loadu_ps(vr + 24);
                            __m256 p0 = _mm256_broadcast_ss(sc), p1 = _mm256_broadcast_ss(sc + 1);
                            __m256 p2 = _mm256_broadcast_ss(sc + 2);
                            a00 = _mm256_fmadd_ps(p0, v0, a00); a01 = _mm256_fmadd_ps(p0, v1, a01);
                            a02 = _mm256_fmadd_ps(p0, v2, a02); a03 = _mm256_fmadd_ps(p0, v3, a03);
                            a10 = _mm256_fmadd_ps(p1, v0, a10); a11 = _mm256_fmadd_ps(p1, v1, a11);
                            a12 = _mm256_fmadd_ps(p1, v2, a12); a13 = _mm256_fmadd_ps(p1, v3, a13);
                            a20 = _mm256_fmadd_ps(p2, v0, a20); a21 = _mm256_fmadd_ps(p2, v1, a21);
                            a22 = _mm256_fmadd_ps(p2, v2, a22); a23 = _mm256_fmadd_ps(p2, v3, a23);
                        } else if (wide) {
                            __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
                            __m256 v2 = _mm256_loadu_ps(vr + 16), v3 = _mm256_loadu_ps(vr + 24);
                            for (int x = 0; x < nr; x++) {
                                __m256 pb = _mm256_broadcast_ss(sc + x);
                                acc[x][0] = _mm256_fmadd_ps(pb, v0, acc[x][0]);
                                acc[x][1] = _mm256_fmadd_ps(pb, v1, acc[x][1]);
                                acc[x][2] = _mm256_fmadd_ps(pb, v2, acc[x][2]);
                                acc[x][3] = _mm256_fmadd_ps(pb, v3, acc[x][3]);
                            }
                        } else {
                            __m256 v0 = _mm256_loadu_ps(vr);
                            for (int x = 0; x < nr; x++)
                                acc[x][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(sc + x), v0, acc[x][0]);
                        }
                    }
                    c += parts[p].n;
                }
                if (wide && nr == 3) {
                    acc[0][0] = a00; acc[0][1] = a01; acc[0][2] = a02; acc[0][3] = a03;
                    acc[1][0] = a10; acc[1][1] = a11; acc[1][2] = a12; acc[1][3] = a13;
                    acc[2][0] = a20; acc[2][1] = a21; acc[2][2] = a22; acc[2][3] = a23;
                }
                for (int x = 0; x < nr; x++)
                    for (int y = 0; y < (wide ? 4 : 1); y++)
                        _mm256_storeu_ps(dst + (int64_t)(r0 + x) * D + e + y * 8, acc[x][y]);
            }
        }
    }
}

/* The lanes of rows r = rv*8 .. rv*8+7 of column c that the mask hides set to -inf (columns some rows see). */
static inline void mask_lanes(float *s, int rv, int R, int Q, const uint8_t *mask, int64_t total, int64_t c) {
    for (int l = 0; l < 8; l++) {
        int r = rv * 8 + l;
        if (r < R && !mask[(r % Q) * total + c]) s[l] = -INFINITY;
    }
}

/* Flash attention's numerics (as `attention._flash_rounded`, the prefill path): unrounded float32 scores, key
 * blocks of `block` columns from column 0, a running max per query row, exp(score - running max) rounded to bf16
 * before it multiplies the values, the sum of the unrounded exps, acc * decay + part per block, and the output
 * acc / sum rounded. S holds the scores [total][R8]; A is scratch [R][D] + 3 * R8 floats. */
static void flash(float *S, int R, int D, const part_t *parts, int nparts, int64_t b, int64_t h, const uint8_t *any,
                  const uint8_t *mask, int Q, int64_t total, int block, float *A, float *out_rows) {
    const int R8 = (R + 7) & ~7, NV = R8 / 8;
    float *part = A + (int64_t)R * D, *top = part + (int64_t)R * D, *norm = top + R8, *decay = norm + R8;
    const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    for (int i = 0; i < R8; i++) { top[i] = -INFINITY; norm[i] = 0.0f; }
    memset(A, 0, sizeof(float) * R * D);
    for (int64_t bs = 0; bs < total; bs += block) {
        int64_t be = bs + block < total ? bs + block : total;
        int live = 0;
        for (int64_t c = bs; c < be; c++) live |= any[c];
        if (!live) continue;  /* a block no row sees changes nothing (decay 1, part 0) */
        for (int rv = 0; rv < NV; rv++) {
            __m256 high = ninf;
            for (int64_t c = bs; c < be; c++) {
                if (!any[c]) continue;
                float *s = S + c * R8 + rv * 8;
                if (any[c] == 2) mask_lanes(s, rv, R, Q, mask, total, c);
                high = _mm256_max_ps(high, _mm256_loadu_ps(s));
            }
            __m256 old = _mm256_loadu_ps(top + rv * 8), now = _mm256_max_ps(old, high);
            __m256 shift = _mm256_blendv_ps(now, zero, _mm256_cmp_ps(now, ninf, _CMP_EQ_OQ));
            __m256 sum = zero;
            for (int64_t c = bs; c < be; c++) {
                if (!any[c]) continue;
                float *s = S + c * R8 + rv * 8;
                __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s), shift));
                sum = _mm256_add_ps(sum, e);
                _mm256_storeu_ps(s, round_bf16(e));
            }
            __m256 d = exp_neg(_mm256_sub_ps(old, shift));
            _mm256_storeu_ps(decay + rv * 8, d);
            _mm256_storeu_ps(norm + rv * 8, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(norm + rv * 8), d), sum));
            _mm256_storeu_ps(top + rv * 8, now);
        }
        pv(S, R, D, parts, nparts, b, h, any, bs, be, part);
        for (int r = 0; r < R; r++) {
            __m256 d = _mm256_set1_ps(decay[r]);
            for (int e = 0; e < D; e += 8) {
                float *a = A + (int64_t)r * D + e;
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(a), d),
                                                  _mm256_loadu_ps(part + (int64_t)r * D + e)));
            }
        }
    }
    for (int r = 0; r < R; r++) {
        __m256 n = _mm256_set1_ps(norm[r]);
        for (int e = 0; e < D; e += 8)
            _mm256_storeu_ps(out_rows + (int64_t)r * D + e,
                             round_bf16(_mm256_div_ps(_mm256_loadu_ps(A + (int64_t)r * D + e), n)));
    }
}

/* One (row, kv head) pair. q: [R][D] scaled and rounded queries of this pair (r = g*Q + q). */
static void pair(const float *q, int R, int D, const part_t *parts, int nparts, const uint8_t *mask, int Q,
                 float post_scale, int block, int64_t total, int64_t b, int64_t h, float *qt, float *S,
                 uint8_t *any, float *A, float *out_rows) {
    const int R8 = (R + 7) & ~7, NV = R8 / 8;
#define SCORE(x) (block ? (x) : round_bf16(x)) /* eager numerics round the scores; flash keeps them float32 */
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
    /* scores S[c][r] = sum_d k[c][d] * qt[d][r], one FMA chain over d per (c, r), rounded in eager numerics */
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
                _mm256_storeu_ps(s, SCORE(a0)); _mm256_storeu_ps(s + 8, SCORE(a1));
                _mm256_storeu_ps(s + 16, SCORE(a2)); _mm256_storeu_ps(s + 24, SCORE(a3));
                _mm256_storeu_ps(s + 32, SCORE(a4)); _mm256_storeu_ps(s + 40, SCORE(a5));
                _mm256_storeu_ps(s + 48, SCORE(a6)); _mm256_storeu_ps(s + 56, SCORE(a7));
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
                        _mm256_storeu_ps(S + (c0 + j + x) * R8 + (rv + y) * 8, SCORE(acc[x][y]));
            }
        }
        c0 += parts[p].n;
    }
#undef SCORE
    if (block) {
        if (post_scale != 1.0f) {
            const __m256 scale = _mm256_set1_ps(post_scale);
            for (int64_t c = 0; c < total; c++)
                if (any[c])
                    for (int rv = 0; rv < NV; rv++)
                        _mm256_storeu_ps(S + c * R8 + rv * 8, _mm256_mul_ps(_mm256_loadu_ps(S + c * R8 + rv * 8), scale));
        }
        flash(S, R, D, parts, nparts, b, h, any, mask, Q, total, block, A, out_rows);
        return;
    }
    /* eager numerics: mask, softmax over columns per query row (lanes), probabilities rounded */
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int rv = 0; rv < NV; rv++) {
        __m256 top = ninf;
        const __m256 scale = _mm256_set1_ps(post_scale);
        for (int64_t c = 0; c < total; c++) {
            float *s = S + c * R8 + rv * 8;
            if (!any[c]) continue;
            if (post_scale != 1.0f) _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_loadu_ps(s), scale));
            if (any[c] == 2) mask_lanes(s, rv, R, Q, mask, total, c);
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
    pv(S, R, D, parts, nparts, b, h, any, 0, total, A);
    for (int64_t i = 0; i < (int64_t)R * D; i += 8)
        _mm256_storeu_ps(out_rows + i, round_bf16(_mm256_loadu_ps(A + i)));
}

/* Attention of B rows x Hkv key/value heads, G query heads per kv head, Q query positions, D (a multiple of 8) dims.
 * q: [B, Hkv, G*Q, D] contiguous, rounded to bf16 (and scaled, where the scale is a power of two: exact).
 * post_scale: 1, or the scale that multiplies the scores in float32 (as torch's path does otherwise).
 * block: 0 for eager numerics (decode steps), else flash numerics over key blocks of that many columns.
 * Parts (1 or 2): keys/values [B, Hkv, n, D] with column stride D. mask: [Bm, Q, total] (1 = attend) or NULL.
 * out: [B, Q, Hkv*G, D]. Returns 0, or -1 when out of memory. */
int ta_attention(const float *q, int64_t B, int64_t Hkv, int G, int Q, int D,
                 const float *k0, const float *v0, int64_t n0, int64_t sb0, int64_t sh0,
                 const float *k1, const float *v1, int64_t n1, int64_t sb1, int64_t sh1,
                 const uint8_t *mask, int64_t mask_rows, float post_scale, int block, float *out) {
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
        float *A = malloc(sizeof(float) * (2 * (int64_t)R * D + 3 * R8));
        int ok = qt && S && any && rows && A;
        if (!ok) failed = 1;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < B * Hkv; i++) {
            if (ok) {
                int64_t b = i / Hkv, h = i % Hkv;
                const uint8_t *m = mask ? mask + (mask_rows == 1 ? 0 : b) * Q * total : NULL;
                pair(q + i * R * D, R, D, parts, nparts, m, Q, post_scale, block, total, b, h, qt, S, any, A, rows);
                for (int g = 0; g < G; g++)
                    for (int t = 0; t < Q; t++)
                        memcpy(out + ((b * Q + t) * Hkv * G + h * G + g) * D, rows + (g * Q + t) * D,
                               sizeof(float) * D);
            }
        }
        free(qt); free(S); free(any); free(rows); free(A);
    }
    return failed ? -1 : 0;
}
