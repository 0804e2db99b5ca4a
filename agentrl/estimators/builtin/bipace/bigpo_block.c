/* BiGPO seed clustering: the greedy decisions of one block of rows (see kernel.py next to this file).
 *
 * Compiled on first use by kernel_loader.py (cc -O3 -march=native -shared) and called through
 * ctypes, which releases the GIL, so two Python threads cluster two groups at once. The product
 * of the block's rows with the seeds found before the block is a torch.mm done by the caller
 * (``old_sims``, raw dot products); this file makes, row by row and in order, the decisions the
 * row-by-row greedy pass makes: the most similar seed (first maximum: the older one wins ties),
 * the cosines with the seeds created earlier in the same block computed here, join when the best
 * cosine is at least ``threshold``, else become a seed. Each exact cosine is ``dot / (|x| |s|)`` in
 * float32, the product of the norms taken first, as the numpy path does; ``threshold`` is a double
 * and the comparison is made in double, as the per-record reference compares Python floats (a
 * cosine can equal the threshold rounded to float32).
 *
 * Screened mode (``delta`` > 0): a cosine first comes from bfloat16 products of the
 * bfloat16-rounded vectors (``old_sims`` from the caller's matmul, or this file's bfloat16 tiles
 * where AVX512-BF16 is compiled in), within ``delta`` of the float32 cosine once divided by the
 * float32 norms (the caller derives the bound). ``offer_screened`` takes the seeds oldest first
 * and computes a float32 cosine only where the screen cannot decide: a seed screening below
 * threshold - delta cannot be joined; one screening more than delta inside the radius and more
 * than 2 delta above the best so far becomes the provisional choice ("pending"), settled only
 * if a later seed comes within reach of it. So every decision equals the exact mode's.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_BF16_TILES 1
#else
#define HAVE_BF16_TILES 0
#endif

typedef float vec16 __attribute__((vector_size(64), aligned(4)));   /* unaligned loads */

#define TILE_ROWS 4          /* rows settled together; their tiles share each seed load */
#define TILE_SEEDS 6         /* seeds per tile: 24 accumulators + 6 seed vectors + 1 row in registers */

static float horizontal_sum(vec16 v) {
    float total = 0.0f;
    for (int lane = 0; lane < 16; lane++) total += v[lane];
    return total;
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static float dot_1x1(const float *row, const float *s, int64_t d) {
    vec16 a = {0};
    int64_t t = 0;
    for (; t + 16 <= d; t += 16) a += *(const vec16 *)(row + t) * *(const vec16 *)(s + t);
    float total = horizontal_sum(a);
    for (; t < d; t++) total += row[t] * s[t];
    return total;
}

/* Dot products of a tile of rows with a tile of vectors: out[r][q] = row[r] . seed[q]. */
static void dot_tile(const float *const row[TILE_ROWS], const float *const seed[TILE_SEEDS], int64_t d,
                     float out[TILE_ROWS][TILE_SEEDS]) {
    vec16 acc[TILE_ROWS][TILE_SEEDS];
    memset(acc, 0, sizeof(acc));
    int64_t t = 0;
    for (; t + 16 <= d; t += 16) {
        vec16 s[TILE_SEEDS];
        for (int q = 0; q < TILE_SEEDS; q++) s[q] = *(const vec16 *)(seed[q] + t);
        for (int r = 0; r < TILE_ROWS; r++) {
            vec16 x = *(const vec16 *)(row[r] + t);
            for (int q = 0; q < TILE_SEEDS; q++) acc[r][q] += x * s[q];
        }
    }
    for (int r = 0; r < TILE_ROWS; r++)
        for (int q = 0; q < TILE_SEEDS; q++) {
            float total = horizontal_sum(acc[r][q]);
            for (int64_t u = t; u < d; u++) total += row[r][u] * seed[q][u];
            out[r][q] = total;
        }
}

#if HAVE_BF16_TILES
/* The same on bfloat16 vectors, products accumulated in float32 (VDPBF16PS). */
static void dot_tile_bf16(const uint16_t *const row[TILE_ROWS], const uint16_t *const seed[TILE_SEEDS],
                          int64_t d, float out[TILE_ROWS][TILE_SEEDS]) {
    __m512 acc[TILE_ROWS][TILE_SEEDS];
    for (int r = 0; r < TILE_ROWS; r++)
        for (int q = 0; q < TILE_SEEDS; q++) acc[r][q] = _mm512_setzero_ps();
    int64_t t = 0;
    for (; t + 32 <= d; t += 32) {
        __m512bh s[TILE_SEEDS];
        for (int q = 0; q < TILE_SEEDS; q++) s[q] = (__m512bh)_mm512_loadu_si512((const void *)(seed[q] + t));
        for (int r = 0; r < TILE_ROWS; r++) {
            __m512bh x = (__m512bh)_mm512_loadu_si512((const void *)(row[r] + t));
            for (int q = 0; q < TILE_SEEDS; q++) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], x, s[q]);
        }
    }
    for (int r = 0; r < TILE_ROWS; r++)
        for (int q = 0; q < TILE_SEEDS; q++) {
            float total = _mm512_reduce_add_ps(acc[r][q]);
            for (int64_t u = t; u < d; u++) total += bf16_to_float(row[r][u]) * bf16_to_float(seed[q][u]);
            out[r][q] = total;
        }
}
#endif

/* Dot products of rows ``rows[r]`` of ``a`` with rows ``cols[q]`` of ``b`` (both d wide): float32,
 * or bfloat16 from the copies ``a16`` / ``b16`` when ``bf16`` (AVX512-BF16 compiled in). */
static void tile_products(int bf16, const float *a, const uint16_t *a16, const int64_t rows[TILE_ROWS],
                          const float *b, const uint16_t *b16, const int64_t cols[TILE_SEEDS], int64_t d,
                          float dots[TILE_ROWS][TILE_SEEDS]) {
#if HAVE_BF16_TILES
    if (bf16) {
        const uint16_t *r16[TILE_ROWS], *c16[TILE_SEEDS];
        for (int r = 0; r < TILE_ROWS; r++) r16[r] = a16 + rows[r] * d;
        for (int q = 0; q < TILE_SEEDS; q++) c16[q] = b16 + cols[q] * d;
        dot_tile_bf16(r16, c16, d, dots);
        return;
    }
#else
    (void)bf16; (void)a16; (void)b16;
#endif
    const float *r32[TILE_ROWS], *c32[TILE_SEEDS];
    for (int r = 0; r < TILE_ROWS; r++) r32[r] = a + rows[r] * d;
    for (int q = 0; q < TILE_SEEDS; q++) c32[q] = b + cols[q] * d;
    dot_tile(r32, c32, d, dots);
}

/* Tile indices starting at row i0 (``rows`` valid) and column j (``width`` valid); a short tile
 * repeats its first row or column. ``col_of`` maps a column to its row of the matrix (NULL: itself). */
static void tile_indices(int64_t i0, int64_t rows, int64_t j, int64_t width, const int64_t *col_of,
                         int64_t rrow[TILE_ROWS], int64_t ccol[TILE_SEEDS]) {
    for (int r = 0; r < TILE_ROWS; r++) rrow[r] = i0 + (r < rows ? r : 0);
    for (int q = 0; q < TILE_SEEDS; q++) {
        const int64_t c = j + (q < width ? q : 0);
        ccol[q] = col_of ? col_of[c] : c;
    }
}

static inline uint16_t float_to_bf16(float f) {        /* round to nearest even; f is finite */
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* float32 -> bfloat16, round to nearest even (VCVTNEPS2BF16 where compiled in). */
static void to_bf16(const float *x, int64_t n, uint16_t *out) {
    int64_t t = 0;
#if HAVE_BF16_TILES
    for (; t + 16 <= n; t += 16)
        _mm256_storeu_si256((__m256i *)(out + t), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + t)));
#endif
    for (; t < n; t++) out[t] = float_to_bf16(x[t]);
}

/* One pass over a group's float32 rows (memory bandwidth is what two threads share): each row's
 * norm (float32 sum of squares in 16 lanes, then sqrt; not clamped) and its bfloat16 copy. */
void bigpo_prepare(const float *x, int64_t n, int64_t d, uint16_t *x_bf16, float *norm) {
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + i * d;
        uint16_t *out = x_bf16 + i * d;
        vec16 acc = {0};
        int64_t t = 0;
        for (; t + 16 <= d; t += 16) {               /* fused: a second loop over the row measured */
            vec16 v = *(const vec16 *)(row + t);     /* 8.6-10.7 ms for the bench batch, this 5.1-5.7 */
            acc += v * v;
#if HAVE_BF16_TILES                                     /* VCVTNEPS2BF16: round to nearest even */
            _mm256_storeu_si256((__m256i *)(out + t), (__m256i)_mm512_cvtneps_pbh((__m512)v));
#else
            for (int lane = 0; lane < 16; lane++) out[t + lane] = float_to_bf16(v[lane]);
#endif
        }
        float total = horizontal_sum(acc);
        for (; t < d; t++) { total += row[t] * row[t]; out[t] = float_to_bf16(row[t]); }
        norm[i] = __builtin_sqrtf(total);
    }
}

/* 1 when the in-block cosines are screened in bfloat16 (AVX512-BF16 at compile time). */
int bigpo_has_bf16_tiles(void) { return HAVE_BF16_TILES; }

/* One group: its rows (float32 and, screened, bfloat16), norms and seeds. */
typedef struct {
    const float *x;
    const uint16_t *x_bf16;
    const float *norm;
    const int64_t *seed_row;           /* seed -> group-local row */
    int64_t d;
    int64_t *settled;                  /* exact cosines the screens asked for */
    const float *centroids;            /* running-mean centroids (unit rows; x unit too), or NULL */
} Group;

static float exact_cosine(const Group *g, int64_t i, int64_t seed) {
    ++*g->settled;
    if (g->centroids) return dot_1x1(g->x + i * g->d, g->centroids + seed * g->d, g->d);
    const int64_t s = g->seed_row[seed];
    return dot_1x1(g->x + i * g->d, g->x + s * g->d, g->d) / (g->norm[i] * g->norm[s]);
}

/* Where one row stands: its most similar seed so far (``arg``, exact cosine ``best``), or an old
 * seed known to be the most similar old one and inside the radius whose exact cosine is not
 * computed yet (``pending``: it lies in [low, high]). */
typedef struct {
    float best, low, high;
    int64_t arg;
    int pending;
} RowBest;

/* Offer seed j with exact ``cosine``: a strictly larger cosine wins, so the older seed wins ties. */
static void offer_exact(RowBest *rb, int64_t j, float cosine, const Group *g, int64_t i) {
    if (rb->pending) {
        if (cosine < rb->low) return;                       /* the pending seed is more similar */
        if (cosine > rb->high) { rb->pending = 0; rb->best = cosine; rb->arg = j; return; }
        rb->best = exact_cosine(g, i, rb->arg);             /* too close to call: compute it */
        rb->pending = 0;
    }
    if (cosine > rb->best) { rb->best = cosine; rb->arg = j; }
}

/* Offer seed j with a screened cosine ``approx`` (the exact one is within delta of it). The exact
 * cosine is computed only when the screen cannot tell how j compares with the row's best so far
 * or with the radius; a seed that certainly wins and is certainly inside the radius becomes
 * pending. Seeds are offered oldest first and replace the best only when strictly more similar,
 * so the outcome is the exact first maximum. */
static void offer_screened(RowBest *rb, int64_t j, float approx, const Group *g, int64_t i, double threshold,
                           float delta) {
    const float low = approx - delta, high = approx + delta;
    if (high < threshold) return;                          /* outside the radius: never joined */
    if (rb->pending) {
        if (high < rb->low) return;
        if (low > rb->high) { rb->arg = j; rb->low = low; rb->high = high; return; }
    } else {
        if (high < rb->best) return;
        if (low > rb->best && low >= threshold) { rb->pending = 1; rb->arg = j; rb->low = low; rb->high = high; return; }
    }
    offer_exact(rb, j, exact_cosine(g, i, j), g, i);
}

/* Decide rows start .. start + b - 1 of a group.
 *
 * x, x_bf16  the group's rows (n x d float32; bfloat16 copy in screened mode, else NULL)
 * norm       the group's row norms
 * old_sims   b x k0 raw dot products of the block's rows with seeds 0 .. k0-1, float32 (exact
 *            mode) or bfloat16 (screened mode, delta > 0); ignored when k0 == 0
 * seed_vec   float32 copies of the seeds in order of creation, for the caller's matmul (exact
 *            mode; NULL in screened mode), appended at k0, k0+1, ...
 * seed_bf16  bfloat16 copies likewise (screened mode; else NULL)
 * seed_row   the seeds' group-local rows, appended likewise
 * owner      group-local seed row of every row; rows start .. start+b-1 are written
 * settled    incremented by the number of exact cosines the screens asked for (may be NULL)
 * Returns the number of seeds after the block.
 *
 * Rows go TILE_ROWS at a time: their cosines with the seeds the block had before them come from
 * TILE_ROWS x TILE_SEEDS tiles of dot products (each vector load feeds several FMAs; a short tile
 * repeats a row or a seed), then they are settled row by row, each row also compared with the
 * seeds created by its tile's earlier rows. On the bench workload the bfloat16 tiles run at about
 * 165 GFLOP/s on one Zen 4 core, near its VDPBF16PS peak; tile shapes from 3 x 7 to 8 x 3 and
 * panels that reuse a seed tile across 4-128 rows measured the same.
 */
int64_t bigpo_decide_block(const float *x, const uint16_t *x_bf16, const float *norm, int64_t start, int64_t b,
                           int64_t d, const void *old_sims, int64_t k0, double threshold, float delta,
                           float *seed_vec, uint16_t *seed_bf16, int64_t *seed_row, int64_t *owner,
                           int64_t *settled) {
    int64_t k = k0, settled_here = 0;
    const Group g = {x, x_bf16, norm, seed_row, d, &settled_here, NULL};
    const int screened = delta > 0.0f;
    const int bf16_tiles = screened && HAVE_BF16_TILES;
    for (int64_t i0 = start; i0 < start + b; i0 += TILE_ROWS) {
        const int64_t quad = start + b - i0 < TILE_ROWS ? start + b - i0 : TILE_ROWS;
        RowBest rb[TILE_ROWS];
        for (int r = 0; r < quad; r++) {
            const int64_t i = i0 + r;
            rb[r] = (RowBest){-__builtin_inff(), 0.0f, 0.0f, -1, 0};
            if (k0 == 0) continue;
            if (screened) {
                const uint16_t *approx = (const uint16_t *)old_sims + (i - start) * k0;
                for (int64_t j = 0; j < k0; j++)
                    offer_screened(&rb[r], j, bf16_to_float(approx[j]) / (norm[i] * norm[seed_row[j]]), &g, i,
                                   threshold, delta);
            } else {
                const float *sims = (const float *)old_sims + (i - start) * k0;
                for (int64_t j = 0; j < k0; j++) offer_exact(&rb[r], j, sims[j] / (norm[i] * norm[seed_row[j]]), &g, i);
            }
        }
        const int64_t k_quad = k;                  /* seeds created before these rows */
        for (int64_t j = k0; j < k_quad; j += TILE_SEEDS) {
            const int64_t width = k_quad - j < TILE_SEEDS ? k_quad - j : TILE_SEEDS;
            int64_t srow[TILE_SEEDS], rrow[TILE_ROWS];
            float dots[TILE_ROWS][TILE_SEEDS];
            tile_indices(i0, quad, j, width, seed_row, rrow, srow);
            tile_products(bf16_tiles, x, x_bf16, rrow, x, x_bf16, srow, d, dots);
            for (int r = 0; r < quad; r++)
                for (int q = 0; q < width; q++) {
                    const float cosine = dots[r][q] / (norm[i0 + r] * norm[srow[q]]);
                    if (bf16_tiles) offer_screened(&rb[r], j + q, cosine, &g, i0 + r, threshold, delta);
                    else offer_exact(&rb[r], j + q, cosine, &g, i0 + r);
                }
        }
        for (int r = 0; r < quad; r++) {
            const int64_t i = i0 + r;
            for (int64_t s = k_quad; s < k; s++)      /* seeds created by this quad's earlier rows */
                offer_exact(&rb[r], s, dot_1x1(x + i * d, x + seed_row[s] * d, d) / (norm[i] * norm[seed_row[s]]), &g, i);
            if (rb[r].arg >= 0 && (rb[r].pending || rb[r].best >= threshold)) {
                owner[i] = seed_row[rb[r].arg];
            } else {
                if (seed_vec) memcpy(seed_vec + k * d, x + i * d, (size_t)d * sizeof(float));
                if (seed_bf16) memcpy(seed_bf16 + k * d, x_bf16 + i * d, (size_t)d * sizeof(uint16_t));
                seed_row[k] = i;
                owner[i] = i;
                k++;
            }
        }
    }
    if (settled) *settled += settled_here;
    return k;
}

/* Running-mean centroids (centroid="mean"): rows ``xn`` (n x d, l2-normalised) in order; a row
 * joins the centroid with the largest dot product (first maximum) if it is at least
 * ``threshold``, which adds the row to the centroid's member sum and re-normalises it; else the
 * row starts a centroid. Rows go TILE_ROWS at a time: their dot products with the centroids as
 * they were before the tile come from tiles; a centroid that an earlier row of the tile moved or
 * created is compared again with a single float32 dot product, so every row sees the centroids
 * exactly as the row-by-row pass does. Screened mode (``delta`` > 0, ``xn_bf16`` and
 * ``cent_bf16`` given, AVX512-BF16 compiled in): the tiles are bfloat16 and their dot products
 * go through the same screen as the seed pass (rows and centroids are unit vectors, so a dot
 * product is the cosine). ``sums``, ``cent`` (and ``cent_bf16``) are n x d scratch; ``label``
 * gets the group-local cluster index. Returns the number of clusters, or -1 if out of memory. */
int64_t bigpo_mean_clusters(const float *xn, const uint16_t *xn_bf16, int64_t n, int64_t d, double threshold,
                            float delta, float *sums, float *cent, uint16_t *cent_bf16, int64_t *label,
                            int64_t *settled) {
    float *stored = malloc((size_t)TILE_ROWS * (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!stored) return -1;
    int64_t k = 0, settled_here = 0;
    const Group g = {xn, xn_bf16, NULL, NULL, d, &settled_here, cent};
    const int bf16 = delta > 0.0f && HAVE_BF16_TILES && xn_bf16 && cent_bf16;
    for (int64_t i0 = 0; i0 < n; i0 += TILE_ROWS) {
        const int64_t rows = n - i0 < TILE_ROWS ? n - i0 : TILE_ROWS;
        const int64_t k_tile = k;                 /* centroids before this tile */
        for (int64_t j = 0; j < k_tile; j += TILE_SEEDS) {
            const int64_t width = k_tile - j < TILE_SEEDS ? k_tile - j : TILE_SEEDS;
            int64_t rrow[TILE_ROWS], ccol[TILE_SEEDS];
            float dots[TILE_ROWS][TILE_SEEDS];
            tile_indices(i0, rows, j, width, NULL, rrow, ccol);
            tile_products(bf16, xn, xn_bf16, rrow, cent, cent_bf16, ccol, d, dots);
            for (int r = 0; r < rows; r++) memcpy(stored + r * n + j, dots[r], (size_t)width * sizeof(float));
        }
        unsigned char moved[TILE_ROWS] = {0};     /* per tile row: did it move a centroid before the tile? */
        int64_t moved_id[TILE_ROWS];
        for (int r = 0; r < rows; r++) {
            const int64_t i = i0 + r;
            const float *row = xn + i * d;
            RowBest rb = {-__builtin_inff(), 0.0f, 0.0f, -1, 0};
            for (int64_t j = 0; j < k; j++) {     /* in order: a strictly larger cosine wins */
                int stale = j >= k_tile;
                for (int u = 0; u < r && !stale; u++) stale = moved[u] && moved_id[u] == j;
                if (stale) offer_exact(&rb, j, dot_1x1(row, cent + j * d, d), &g, i);
                else if (bf16) offer_screened(&rb, j, stored[r * n + j], &g, i, threshold, delta);
                else offer_exact(&rb, j, stored[r * n + j], &g, i);
            }
            if (rb.arg >= 0 && (rb.pending || rb.best >= threshold)) {
                const int64_t j = rb.arg;
                float *sum = sums + j * d, *c = cent + j * d;
                vec16 acc = {0};
                int64_t t = 0;
                for (; t + 16 <= d; t += 16) {
                    vec16 v = *(vec16 *)(sum + t) + *(const vec16 *)(row + t);
                    *(vec16 *)(sum + t) = v;
                    acc += v * v;
                }
                float total = horizontal_sum(acc);
                for (; t < d; t++) { sum[t] += row[t]; total += sum[t] * sum[t]; }
                float norm = __builtin_sqrtf(total);
                if (norm < 1e-12f) norm = 1e-12f;
                for (t = 0; t < d; t++) c[t] = sum[t] / norm;
                if (cent_bf16) to_bf16(c, d, cent_bf16 + j * d);
                label[i] = j;
                if (j < k_tile) { moved[r] = 1; moved_id[r] = j; }
            } else {
                memcpy(sums + k * d, row, (size_t)d * sizeof(float));
                memcpy(cent + k * d, row, (size_t)d * sizeof(float));
                if (cent_bf16) memcpy(cent_bf16 + k * d, xn_bf16 + i * d, (size_t)d * sizeof(uint16_t));
                label[i] = k;
                k++;
            }
        }
    }
    free(stored);
    if (settled) *settled += settled_here;
    return k;
}
