/* A decode step's per-layer work besides the matmuls, on the CPU, in float32: residual add
   and RMSNorm, rotary embedding, the KV-cache write, and attention of one query
   token per sequence over its paged context. As torch ops these are 20-odd calls a layer, each costing more in dispatch than in
   arithmetic when a step decodes a handful of tokens; here each is one call.

   They compute what the torch references in rmsnorm.py, rotary.py, kv_cache_write.py and
   decode_attention.py compute. Built with -ffp-contract=off, the rotary and the KV write are
   bitwise the references'; the norm and attention sum in their own order, and the softmax
   takes a vectorised exp (`exp_poly`), within float32 rounding of torch's. (The modules' MLP gate stays torch's: its vectorised exp beats a
   scalar one.) cpu_decode_step.c includes this file: it runs these, the projections and a
   vectorised gate of its own for every layer of a decode step in one call.

   Every function checks the indices it is given against the sizes it is told and returns
   nonzero, writing nothing out of bounds, when one is outside them.

   The KV caches hold float32 or, with `half`, float16 (IEEE binary16, torch's float16): the
   engine keeps float16 on the CPU (model/kv_cache.py), half the bytes to hold and to read; the
   float32 caches of tests and of a model computing in float16 elsewhere still work. The
   conversions are F16C's: storing rounds to nearest even, as torch's `.half()` does, and
   reading widens exactly, so the attention is the reference's over the same float16 cache. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rotate each of `tokens` rows of `heads` heads (x: rows `x_stride` floats apart, heads
   contiguous) at its position, with "rotate half" pairing over the first `rotary_dim` dims:
   out = x * cos + cat(-x2, x1) * sin. cos/sin: [max_positions][rotary_dim]. out: contiguous
   [tokens][heads][head_dim]. */
int rotary(const int64_t *positions, int64_t tokens, const float *x, int64_t x_stride,
           int64_t heads, int64_t head_dim, const float *cos_table, const float *sin_table,
           int64_t max_positions, int64_t rotary_dim, float *out) {
    int64_t half = rotary_dim / 2;
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_positions) return 1;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_table + positions[t] * rotary_dim;
        const float *s = sin_table + positions[t] * rotary_dim;
        for (int64_t h = 0; h < heads; h++) {
            const float *in = x + t * x_stride + h * head_dim;
            float *o = out + (t * heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) o[i] = in[i] * c[i] + (-in[i + half]) * s[i];
            for (int64_t i = half; i < rotary_dim; i++) o[i] = in[i] * c[i] + in[i - half] * s[i];
            for (int64_t i = rotary_dim; i < head_dim; i++) o[i] = in[i];
        }
    }
    return 0;
}

static void to_half(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

static void from_half(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}

/* Store `n` floats as row `index` of a cache of float32 or (`half`) float16 rows. */
static void store_row(const float *src, void *cache, int half, int64_t index, int64_t n) {
    if (half)
        to_half(src, (uint16_t *)cache + index * n, n);
    else
        memcpy((float *)cache + index * n, src, sizeof(float) * n);
}

/* Row `index` of `n` floats of a cache: a pointer into a float32 one, or a float16 one's row
   widened into `buffer`. */
static const float *cache_row(const void *cache, int half, int64_t index, int64_t n,
                              float *buffer) {
    if (!half) return (const float *)cache + index * n;
    from_half((const uint16_t *)cache + index * n, buffer, n);
    return buffer;
}

/* Store each token's key and value row (`row` floats; rows `key_stride` and `value_stride`
   apart) into cache slot `slots[t]` of caches with `num_slots` rows, float32 or (`half`)
   float16; slot -1 skips. */
int write_kv(const float *key, int64_t key_stride, const float *value, int64_t value_stride,
             int64_t tokens, int64_t row, const int64_t *slots, void *k_cache, void *v_cache,
             int64_t num_slots, int half) {
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] < -1 || slots[t] >= num_slots) return 1;
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        store_row(key + t * key_stride, k_cache, half, slots[t], row);
        store_row(value + t * value_stride, v_cache, half, slots[t], row);
    }
    return 0;
}

/* One row of `add_rmsnorm`: out = rmsnorm(x + residual) * weight, sum = x + residual
   (residual may be NULL). Any of out, sum and x may be the same row: each element is read
   before it is written, so a row can be normed in place. */
static void norm_row(const float *x, const float *residual, const float *weight, int64_t hidden,
                     float eps, float *out, float *sum) {
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < hidden; i++) {
        float v = residual ? x[i] + residual[i] : x[i];
        sum[i] = v;
        squares += v * v;
    }
    float inverse = 1.0f / sqrtf(squares / (float)hidden + eps);
#pragma omp simd
    for (int64_t i = 0; i < hidden; i++) out[i] = weight[i] * (sum[i] * inverse);
}

/* out = rmsnorm(x + residual) * weight and residual_out = x + residual, per row of `hidden`
   (x and residual rows `x_stride` and `residual_stride` apart; residual may be NULL). */
void add_rmsnorm(const float *x, int64_t x_stride, const float *residual,
                 int64_t residual_stride, const float *weight, int64_t rows, int64_t hidden,
                 float eps, float *out, float *residual_out) {
#pragma omp parallel for if (rows >= 16) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * x_stride, residual ? residual + r * residual_stride : NULL, weight,
                 hidden, eps, out + r * hidden, residual_out + r * hidden);
}

/* e^x within about an ulp for x in [-87.3, 88.3] (clamped there: silu's input and the
   softmax's, at most 0, need no more), as Cephes' expf computes it: x = n ln 2 + r, e^r by a degree-7 polynomial, 2^n
   put into the exponent bits. n is rounded by adding and taking away 1.5 * 2^23 (exact in
   float32 for |n| < 2^22): floorf or a rounding branch keeps GCC from vectorising the loop,
   and a call to libm's expf would run one value at a time. */
static inline float exp_poly(float x) {
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* x / ln 2, rounded */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t bits;
        float value;
    } two_to_n = {.bits = ((int32_t)n + 127) << 23};
    return p * two_to_n.value;
}

static float dot(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* A score s soft-capped, as softcap * tanh(s / softcap) (Gemma 2); a cap of 0 leaves it. */
static float capped(float s, float softcap) {
    return softcap > 0.0f ? tanhf(s / softcap) * softcap : s;
}

/* One sequence's query heads of one KV head over its cached tokens `first`..`context` - 1.
   `row`: head_dim floats, where a float16 cache's K or V row is widened (once for the group). */
static void attend(const float *q, int64_t group, int64_t head_dim, const void *k_cache,
                   const void *v_cache, int half, int64_t kv_heads, int64_t kv_head,
                   int64_t block_size, const int32_t *table, int64_t first, int64_t context,
                   float scale, float softcap, float *scores, float *row, float *out) {
    int64_t n = context - first;
    for (int64_t t = first; t < context; t++) {
        int64_t slot = (int64_t)table[t / block_size] * block_size + t % block_size;
        const float *k = cache_row(k_cache, half, slot * kv_heads + kv_head, head_dim, row);
        for (int64_t g = 0; g < group; g++) {
            float score = dot(q + g * head_dim, k, head_dim) * scale;
            scores[g * n + t - first] = capped(score, softcap);
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *p = scores + g * n, top = -INFINITY, total = 0.0f;
#pragma omp simd reduction(max : top)
        for (int64_t t = 0; t < n; t++) top = p[t] > top ? p[t] : top;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < n; t++) total += p[t] = exp_poly(p[t] - top);
#pragma omp simd
        for (int64_t t = 0; t < n; t++) p[t] /= total;
        memset(out + g * head_dim, 0, sizeof(float) * head_dim);
    }
    for (int64_t t = first; t < context; t++) {
        int64_t slot = (int64_t)table[t / block_size] * block_size + t % block_size;
        const float *v = cache_row(v_cache, half, slot * kv_heads + kv_head, head_dim, row);
        for (int64_t g = 0; g < group; g++) {
            float p = scores[g * n + t - first], *o = out + g * head_dim;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; d++) o[d] += p * v[d];
        }
    }
}

/* q [seqs][heads][head_dim] -> out, same shape: each sequence's query over its context_lens[s]
   cached tokens, found through its row of block_tables [seqs][max_blocks] in caches of
   `num_blocks` blocks [block_size][kv_heads][head_dim]; with `window` > 0, over the last
   `window` of them only (a sliding-window layer); with `softcap` > 0, each score capped by it
   (Gemma 2). The caches hold float32 or (`half`) float16. A context of 0 gives zeros. */
int decode_attention(const float *q, int64_t seqs, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, const void *k_cache, const void *v_cache, int half,
                     int64_t num_blocks, int64_t block_size, const int32_t *block_tables,
                     int64_t max_blocks, const int32_t *context_lens, float scale,
                     int64_t window, float softcap, float *out) {
    int64_t group = heads / kv_heads, longest = 0;
    if (kv_heads <= 0 || heads % kv_heads || window < 0 || !(softcap >= 0.0f)) return 1;
    for (int64_t s = 0; s < seqs; s++) {
        int64_t context = context_lens[s];
        if (context < 0 || context > max_blocks * block_size) return 1;
        for (int64_t b = 0; b * block_size < context; b++) {
            int32_t block = block_tables[s * max_blocks + b];
            if (block < 0 || block >= num_blocks) return 1;
        }
        longest = context > longest ? context : longest;
    }
    int failed = 0;
    /* A few short contexts are less work than waking a second thread. */
#pragma omp parallel if (seqs * kv_heads * longest >= 4096)
    {
        /* The group's scores, then one widened K or V row. */
        int64_t scored = group * (longest ? longest : 1);
        float *scores = malloc(sizeof(float) * (size_t)(scored + head_dim));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2) schedule(static)
        for (int64_t s = 0; s < seqs; s++)
            for (int64_t h = 0; h < kv_heads; h++) {
                float *o = out + (s * heads + h * group) * head_dim;
                if (!scores || context_lens[s] == 0) {
                    memset(o, 0, sizeof(float) * group * head_dim);
                    continue;
                }
                int64_t context = context_lens[s];
                int64_t first = window > 0 && context > window ? context - window : 0;
                attend(q + (s * heads + h * group) * head_dim, group, head_dim, k_cache, v_cache,
                       half, kv_heads, h, block_size, block_tables + s * max_blocks, first,
                       context, scale, softcap, scores, scores + scored, o);
            }
        free(scores);
    }
    return failed;
}
