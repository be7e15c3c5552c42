/* A decode step's per-layer work besides the matmuls, on the CPU, in float32: residual add
   and RMSNorm, rotary embedding, the KV-cache write, and attention of one query
   token per sequence over its paged context. As torch ops these are 20-odd calls a layer, each costing more in dispatch than in
   arithmetic when a step decodes a handful of tokens; here each is one call.

   They compute what the torch references in rmsnorm.py, rotary.py, kv_cache_write.py and
   decode_attention.py compute. Built with -ffp-contract=off, the rotary and the KV write are
   bitwise the references'; the norm and attention sum in their own order, within float32
   rounding of torch's. (The modules' MLP gate stays torch's: its vectorised exp beats a
   scalar one.) cpu_decode_step.c includes this file: it runs these, the projections and a
   vectorised gate of its own for every layer of a decode step in one call.

   Every function checks the indices it is given against the sizes it is told and returns
   nonzero, writing nothing out of bounds, when one is outside them. */

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

/* Copy each token's key and value row (`row` floats; rows `key_stride` and `value_stride`
   apart) into cache slot `slots[t]` of caches with `num_slots` rows; slot -1 skips. */
int write_kv(const float *key, int64_t key_stride, const float *value, int64_t value_stride,
             int64_t tokens, int64_t row, const int64_t *slots, float *k_cache, float *v_cache,
             int64_t num_slots) {
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] < -1 || slots[t] >= num_slots) return 1;
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        memcpy(k_cache + slots[t] * row, key + t * key_stride, sizeof(float) * row);
        memcpy(v_cache + slots[t] * row, value + t * value_stride, sizeof(float) * row);
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

/* One sequence's query heads of one KV head over its cached tokens `first`..`context` - 1. */
static void attend(const float *q, int64_t group, int64_t head_dim, const float *k_cache,
                   const float *v_cache, int64_t kv_heads, int64_t kv_head, int64_t block_size,
                   const int32_t *table, int64_t first, int64_t context, float scale,
                   float softcap, float *scores, float *out) {
    int64_t n = context - first;
    for (int64_t t = first; t < context; t++) {
        int64_t slot = (int64_t)table[t / block_size] * block_size + t % block_size;
        const float *k = k_cache + (slot * kv_heads + kv_head) * head_dim;
        for (int64_t g = 0; g < group; g++) {
            float score = dot(q + g * head_dim, k, head_dim) * scale;
            scores[g * n + t - first] = capped(score, softcap);
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *p = scores + g * n, top = -INFINITY, total = 0.0f;
        for (int64_t t = 0; t < n; t++) top = p[t] > top ? p[t] : top;
        for (int64_t t = 0; t < n; t++) total += p[t] = expf(p[t] - top);
        for (int64_t t = 0; t < n; t++) p[t] /= total;
        memset(out + g * head_dim, 0, sizeof(float) * head_dim);
    }
    for (int64_t t = first; t < context; t++) {
        int64_t slot = (int64_t)table[t / block_size] * block_size + t % block_size;
        const float *v = v_cache + (slot * kv_heads + kv_head) * head_dim;
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
   (Gemma 2). A context of 0 gives zeros. */
int decode_attention(const float *q, int64_t seqs, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, const float *k_cache, const float *v_cache,
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
        float *scores = malloc(sizeof(float) * (size_t)(group * (longest ? longest : 1)));
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
                       kv_heads, h, block_size, block_tables + s * max_blocks, first, context,
                       scale, softcap, scores, o);
            }
        free(scores);
    }
    return failed;
}
