/* BiGPO seed clustering: the greedy decisions of one block of rows (see bigpo_clustering.py).
 *
 * Compiled on first use by agentrl/native.py (cc -O3 -march=native -shared) and called through
 * ctypes, which releases the GIL, so two Python threads cluster two groups at once. The product
 * of the block's rows with the seeds found before the block is a torch.mm done by the caller
 * (``old_sims``, raw dot products); this file makes, row by row and in order, the decisions the
 * row-by-row greedy pass makes: the most similar seed (first maximum: the older one wins ties),
 * the cosines with the seeds created earlier in the same block computed here, join when the best
 * cosine is at least ``threshold``, else become a seed. Each cosine is ``dot / (|x| |s|)`` in float32,
 * the product of the norms taken first, as the numpy path does.
 */
#include <stdint.h>
#include <string.h>

typedef float vec16 __attribute__((vector_size(64), aligned(4)));   /* unaligned loads */

static float horizontal_sum(vec16 v) {
    float total = 0.0f;
    for (int lane = 0; lane < 16; lane++) total += v[lane];
    return total;
}

static float dot_1x1(const float *row, const float *s, int64_t d) {
    vec16 a = {0};
    int64_t t = 0;
    for (; t + 16 <= d; t += 16) a += *(const vec16 *)(row + t) * *(const vec16 *)(s + t);
    float total = horizontal_sum(a);
    for (; t < d; t++) total += row[t] * s[t];
    return total;
}

/* Dot products of four rows with four vectors: out[r][q] = rows[r] . seeds[q]. */
static void dot_4x4(const float *const row[4], const float *const seed[4], int64_t d, float out[4][4]) {
    vec16 acc[4][4];
    memset(acc, 0, sizeof(acc));
    int64_t t = 0;
    for (; t + 16 <= d; t += 16) {
        vec16 s0 = *(const vec16 *)(seed[0] + t), s1 = *(const vec16 *)(seed[1] + t);
        vec16 s2 = *(const vec16 *)(seed[2] + t), s3 = *(const vec16 *)(seed[3] + t);
        for (int r = 0; r < 4; r++) {
            vec16 x = *(const vec16 *)(row[r] + t);
            acc[r][0] += x * s0; acc[r][1] += x * s1; acc[r][2] += x * s2; acc[r][3] += x * s3;
        }
    }
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) {
            float total = horizontal_sum(acc[r][q]);
            for (int64_t u = t; u < d; u++) total += row[r][u] * seed[q][u];
            out[r][q] = total;
        }
}

/* Most similar seed of one row among ``seeds[lo .. hi)`` given their raw dot products
 * ``dots[j - lo]``: updates (best, arg) on a strictly larger cosine, so the older seed wins ties. */
static void take_best(const float *dots, int64_t lo, int64_t hi, float norm, const float *seed_norm,
                      float *best, int64_t *arg) {
    for (int64_t j = lo; j < hi; j++) {
        float cosine = dots[j - lo] / (norm * seed_norm[j]);
        if (cosine > *best) { *best = cosine; *arg = j; }
    }
}

/* Decide the rows ``start .. start + b - 1`` of a group.
 *
 * rows      b x d, the block's rows (contiguous)
 * row_norm  b, their norms
 * old_sims  b x k0 raw dot products with the seeds 0 .. k0-1 (ignored when k0 == 0)
 * seed_vec  capacity x d: seeds in order of creation; new seeds are appended at k0, k0+1, ...
 * seed_norm, seed_row   the seeds' norms and group-local row indices, appended likewise
 * owner     group-local seed row of every row of the group; rows start .. start+b-1 are written
 * Returns the number of seeds after the block.
 *
 * Rows go four at a time: their dot products with the seeds the block had before the quad are
 * 4 x 4 tiles (each vector load feeds four FMAs); then the quad is settled row by row, each row
 * also compared with the seeds its quad created before it.
 */
int64_t bigpo_decide_block(const float *rows, int64_t b, int64_t d, const float *row_norm,
                           const float *old_sims, int64_t k0, float threshold, int64_t start,
                           float *seed_vec, float *seed_norm, int64_t *seed_row, int64_t *owner) {
    int64_t k = k0;
    for (int64_t i0 = 0; i0 < b; i0 += 4) {
        const int64_t quad = b - i0 < 4 ? b - i0 : 4;
        float best[4];
        int64_t arg[4];
        const float *row[4];
        for (int r = 0; r < 4; r++) {
            row[r] = rows + (i0 + (r < quad ? r : 0)) * d;     /* a short quad repeats its first row */
            best[r] = -__builtin_inff();
            arg[r] = -1;
            if (r < quad)
                take_best(old_sims + (i0 + r) * k0, 0, k0, row_norm[i0 + r], seed_norm, &best[r], &arg[r]);
        }
        const int64_t k_quad = k;                  /* seeds created before this quad */
        int64_t j = k0;
        for (; j + 4 <= k_quad; j += 4) {
            const float *seed[4] = {seed_vec + j * d, seed_vec + (j + 1) * d, seed_vec + (j + 2) * d,
                                    seed_vec + (j + 3) * d};
            float dots[4][4];
            dot_4x4(row, seed, d, dots);
            for (int r = 0; r < quad; r++)
                take_best(dots[r], j, j + 4, row_norm[i0 + r], seed_norm, &best[r], &arg[r]);
        }
        for (int r = 0; r < quad; r++) {
            const int64_t i = i0 + r;
            const float norm = row_norm[i];
            for (int64_t s = j; s < k; s++) {       /* the rest before the quad, then the quad's own */
                float dot = dot_1x1(row[r], seed_vec + s * d, d);
                take_best(&dot, s, s + 1, norm, seed_norm, &best[r], &arg[r]);
            }
            if (arg[r] >= 0 && best[r] >= threshold) {
                owner[start + i] = seed_row[arg[r]];
            } else {
                memcpy(seed_vec + k * d, row[r], (size_t)d * sizeof(float));
                seed_norm[k] = norm;
                seed_row[k] = start + i;
                owner[start + i] = start + i;
                k++;
            }
        }
    }
    return k;
}
