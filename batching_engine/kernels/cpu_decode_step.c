/* A decode step's decoder layers and final norm, all of them in one call, on the CPU in
   float32 (its KV caches float16 or float32, as cpu_decode.c's note says): the same work as the model's modules (llama.py) with the same kernels, without
   the Python around 30 layers of them, which cost more than the kernels themselves.

   Per layer: add + RMSNorm, the fused qkv projection (+ bias), per-head q/k norms (Qwen3),
   rotary, the KV-cache write, paged decode attention, o_proj (+ bias), add + RMSNorm, the
   gate_up projection, silu(gate) * up, the down projection; then the final norm. The norms,
   rotary, write and attention are cpu_decode.c's (included here, built with the same
   -ffp-contract=off); the projections are the quantized matmul of cpu_quantized_matmul.c,
   called through the pointer its loaded library gives (its source is not part of this one).
   So only the gate rounds differently from the module path: a vectorisable exp (cpu_decode.c's
   `exp_poly`, the one attention's softmax takes) instead of torch's, within float32 rounding
   of it.

   The model is described once (`Model`, built by cpu_decode_step.py); a step brings only its
   own tensors. Every index a step brings is checked against the model's tables and caches
   before anything is written: a bad one returns nonzero (`StepStatus`) and changes nothing. */

#include "cpu_decode.c"

typedef int (*Matmul)(int mode, const float *x, int64_t m, int64_t ldx, int64_t k,
                      const void *codes, const float *scales, const float *lows, int64_t n,
                      float *y);

/* y [m][n] = x [m][k] @ w.T (+ bias): a `PackedWeight`'s tensors, as quantized_matmul takes
   them; bias NULL for none. */
typedef struct {
    int64_t mode, n, k;
    const void *codes;
    const float *scales, *lows, *bias;
} Projection;

typedef struct {
    Projection qkv, o, gate_up, down;
    const float *input_norm, *post_norm;
    const float *q_norm, *k_norm; /* Qwen3's per-head norms: both, or both NULL */
    const float *cos, *sin;       /* [max_positions][rotary_dim] */
    void *k_cache, *v_cache;      /* [num_blocks][block_size][kv_heads][head_dim] */
    int64_t max_positions, rotary_dim, window, num_blocks;
    float input_eps, post_eps, qk_eps, scale, softcap;
} Layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size;
    int64_t kv_half; /* every layer's caches hold float16 (1) or float32 (0) */
    const Layer *layers;
    const float *final_norm;
    float final_eps;
    Matmul matmul;
} Model;

typedef enum {
    STEP_OK,
    STEP_BAD_MODEL,   /* the description's sizes disagree, or the scratch is too small */
    STEP_BAD_POSITION,
    STEP_BAD_SLOT,
    STEP_BAD_CONTEXT,
    STEP_BAD_BLOCK,
    STEP_NO_MEMORY,   /* a kernel could not allocate its buffer */
} StepStatus;

/* One step's intermediate rows, carved from the caller's scratch. */
typedef struct {
    float *normed, *residual, *out, *qkv, *q, *k, *attention, *gate_up, *act;
} Buffers;

/* Floats of scratch a step of `tokens` needs (`Buffers`). */
int64_t decode_step_scratch(const Model *m, int64_t tokens) {
    int64_t q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
    return tokens * (3 * m->hidden + (q + 2 * kv) + q + kv + q + 3 * m->intermediate);
}

static Buffers carve(const Model *m, int64_t tokens, float *scratch) {
    int64_t q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
    Buffers b;
    b.normed = scratch;
    b.residual = b.normed + tokens * m->hidden;
    b.out = b.residual + tokens * m->hidden;
    b.qkv = b.out + tokens * m->hidden;
    b.q = b.qkv + tokens * (q + 2 * kv);
    b.k = b.q + tokens * q;
    b.attention = b.k + tokens * kv;
    b.gate_up = b.attention + tokens * q;
    b.act = b.gate_up + tokens * 2 * m->intermediate;
    return b;
}

static int fits(const Projection *p, int64_t n, int64_t k) {
    return p->n == n && p->k == k && (p->mode == 8 || p->mode == 4);
}

/* Whether every layer's projections have the sizes the buffers are carved for. */
static int model_fits(const Model *m) {
    int64_t q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
    if (m->kv_heads <= 0 || m->heads % m->kv_heads || m->block_size <= 0 ||
        (m->kv_half != 0 && m->kv_half != 1))
        return 0;
    for (int64_t l = 0; l < m->num_layers; l++) {
        const Layer *layer = m->layers + l;
        if (!fits(&layer->qkv, q + 2 * kv, m->hidden) || !fits(&layer->o, m->hidden, q) ||
            !fits(&layer->gate_up, 2 * m->intermediate, m->hidden) ||
            !fits(&layer->down, m->hidden, m->intermediate) || layer->num_blocks < 0 ||
            layer->rotary_dim > m->head_dim)
            return 0;
    }
    return 1;
}

/* Every position inside every layer's rotary table, every slot inside every cache, every
   context inside its block table row and every block it covers inside every cache. */
static StepStatus check_step(const Model *m, int64_t tokens, const int64_t *positions,
                             const int64_t *slots, const int32_t *block_tables,
                             int64_t max_blocks, const int32_t *context_lens) {
    int64_t max_positions = INT64_MAX, num_blocks = INT64_MAX;
    for (int64_t l = 0; l < m->num_layers; l++) {
        const Layer *layer = m->layers + l;
        max_positions = layer->max_positions < max_positions ? layer->max_positions : max_positions;
        num_blocks = layer->num_blocks < num_blocks ? layer->num_blocks : num_blocks;
    }
    for (int64_t t = 0; t < tokens; t++) {
        if (positions[t] < 0 || positions[t] >= max_positions) return STEP_BAD_POSITION;
        if (slots[t] < -1 || slots[t] >= num_blocks * m->block_size) return STEP_BAD_SLOT;
        int64_t context = context_lens[t];
        if (context < 0 || context > max_blocks * m->block_size) return STEP_BAD_CONTEXT;
        for (int64_t b = 0; b * m->block_size < context; b++) {
            int32_t block = block_tables[t * max_blocks + b];
            if (block < 0 || block >= num_blocks) return STEP_BAD_BLOCK;
        }
    }
    return STEP_OK;
}

static StepStatus project(const Model *m, const Projection *p, const float *x, int64_t tokens,
                          float *y) {
    if (m->matmul((int)p->mode, x, tokens, p->k, p->k, p->codes, p->scales, p->lows, p->n, y))
        return STEP_NO_MEMORY;
    if (p->bias)
        for (int64_t t = 0; t < tokens; t++)
#pragma omp simd
            for (int64_t j = 0; j < p->n; j++) y[t * p->n + j] += p->bias[j];
    return STEP_OK;
}

/* RMSNorm of each of `heads` heads of each token's row, in place (Qwen3's q/k norms). */
static void norm_heads(float *rows, int64_t tokens, int64_t stride, int64_t heads,
                       int64_t head_dim, const float *weight, float eps) {
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            float *x = rows + t * stride + h * head_dim;
            norm_row(x, NULL, weight, head_dim, eps, x, x);
        }
}

/* The layer's attention of b->normed into b->out: its tokens' K/V written into its cache. */
static StepStatus attention(const Model *m, const Layer *layer, int64_t tokens,
                            const int64_t *positions, const int64_t *slots,
                            const int32_t *block_tables, int64_t max_blocks,
                            const int32_t *context_lens, const Buffers *b) {
    int64_t d = m->head_dim, q = m->heads * d, kv = m->kv_heads * d, width = q + 2 * kv;
    StepStatus status = project(m, &layer->qkv, b->normed, tokens, b->qkv);
    if (status) return status;
    if (layer->q_norm && layer->k_norm) {
        norm_heads(b->qkv, tokens, width, m->heads, d, layer->q_norm, layer->qk_eps);
        norm_heads(b->qkv + q, tokens, width, m->kv_heads, d, layer->k_norm, layer->qk_eps);
    }
    if (rotary(positions, tokens, b->qkv, width, m->heads, d, layer->cos, layer->sin,
               layer->max_positions, layer->rotary_dim, b->q) ||
        rotary(positions, tokens, b->qkv + q, width, m->kv_heads, d, layer->cos, layer->sin,
               layer->max_positions, layer->rotary_dim, b->k))
        return STEP_BAD_POSITION;
    int half = (int)m->kv_half;
    if (write_kv(b->k, kv, b->qkv + q + kv, width, tokens, kv, slots, layer->k_cache,
                 layer->v_cache, layer->num_blocks * m->block_size, half))
        return STEP_BAD_SLOT;
    if (decode_attention(b->q, tokens, m->heads, m->kv_heads, d, layer->k_cache, layer->v_cache,
                         half, layer->num_blocks, m->block_size, block_tables, max_blocks,
                         context_lens, layer->scale, layer->window, layer->softcap,
                         b->attention))
        return STEP_BAD_BLOCK;
    return project(m, &layer->o, b->attention, tokens, b->out);
}

/* out [tokens][width] = silu(gate) * up of rows [tokens][gate | up], as torch computes
   silu: x / (1 + e^-x). */
static void silu_and_mul(const float *gate_up, int64_t tokens, int64_t width, float *out) {
    for (int64_t t = 0; t < tokens; t++) {
        const float *gate = gate_up + t * 2 * width, *up = gate + width;
        float *o = out + t * width;
#pragma omp simd
        for (int64_t i = 0; i < width; i++) o[i] = gate[i] / (1.0f + exp_poly(-gate[i])) * up[i];
    }
}

static StepStatus mlp(const Model *m, const Layer *layer, int64_t tokens, const Buffers *b) {
    StepStatus status = project(m, &layer->gate_up, b->normed, tokens, b->gate_up);
    if (status) return status;
    silu_and_mul(b->gate_up, tokens, m->intermediate, b->act);
    return project(m, &layer->down, b->act, tokens, b->out);
}

/* Every layer and the final norm for `tokens` sequences of one query token each: embedded
   [tokens][hidden] in, out [tokens][hidden] the normed hidden states. positions, slots: per
   token; block_tables [tokens][max_blocks], context_lens [tokens]: per sequence. `scratch`
   holds `scratch_size` floats, at least `decode_step_scratch`'s. */
int decode_step(const Model *m, const float *embedded, int64_t tokens, const int64_t *positions,
                const int64_t *slots, const int32_t *block_tables, int64_t max_blocks,
                const int32_t *context_lens, float *scratch, int64_t scratch_size, float *out) {
    if (tokens < 0 || max_blocks < 0 || !model_fits(m) ||
        scratch_size < decode_step_scratch(m, tokens))
        return STEP_BAD_MODEL;
    StepStatus status =
        check_step(m, tokens, positions, slots, block_tables, max_blocks, context_lens);
    if (status) return status;
    Buffers b = carve(m, tokens, scratch);
    const float *x = embedded, *residual = NULL;
    for (int64_t l = 0; l < m->num_layers && !status; l++) {
        const Layer *layer = m->layers + l;
        add_rmsnorm(x, m->hidden, residual, m->hidden, layer->input_norm, tokens, m->hidden,
                    layer->input_eps, b.normed, b.residual);
        status = attention(m, layer, tokens, positions, slots, block_tables, max_blocks,
                           context_lens, &b);
        if (status) break;
        add_rmsnorm(b.out, m->hidden, b.residual, m->hidden, layer->post_norm, tokens,
                    m->hidden, layer->post_eps, b.normed, b.residual);
        status = mlp(m, layer, tokens, &b);
        x = b.out, residual = b.residual;
    }
    if (status) return status;
    add_rmsnorm(x, m->hidden, residual, m->hidden, m->final_norm, tokens, m->hidden,
                m->final_eps, out, b.residual);
    return STEP_OK;
}
