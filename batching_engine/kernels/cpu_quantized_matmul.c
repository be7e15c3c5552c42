/* y = x @ w.T for weights held as int8 rows or int4 groups, on an x86 CPU.

   torch's own weight-only CPU kernels took 6-8x (int8) and 16-19x (int4) float32's time for a
   SmolLM2 decode step on a 2-core AVX-512 EPYC (bench/quantized_matmul.py). One source builds
   four ways (cpu_build.py picks the one the CPU runs; cpu_quantized_matmul.py packs for it):
   AVX2 (WIDTH 8: ymm registers) or AVX-512 (WIDTH 16: zmm), each either multiplying in float
   (x as given) or, with VNNI (-DVNNI=1: AVX-VNNI on ymm, AVX512-VNNI on zmm), in integers.

   Output columns (the weight's rows) are taken STRIP = 2 * WIDTH at a time, a "strip"; the
   column count is padded to whole strips with zero codes, whose outputs are dropped. Each
   thread takes whole strips. GROUP = 32 inputs (k) make an int4 group, with a scale and a
   minimum per column: w = code * scale + low, codes 0..15. int8 has one scale per column.

   Float builds: a strip holds, for each k, the codes of its columns side by side:
     int8: codes[strip][k][STRIP], scales[strip][STRIP];
     int4: codes[strip][k / 2][STRIP], each byte the code of k (high nibble) and k + 1 (low),
           scales[strip][group][STRIP], lows[strip][group][STRIP].
   One row of x reads the codes directly; int8 with up to DIRECT_ROWS rows too, ROWS at a
   time; more rows convert the strip once into a float buffer [k][STRIP] (L2-resident) and run
   every ROWS rows of x over it with 2 * ROWS vector accumulators.

   VNNI builds quantize x first, each row per block of 32 k as llama.cpp's Q8 activations do
   (symmetric int8 codes, scale = max|x| / 127), then sum code times code with vpdpbusd, which
   adds 4 products of an unsigned byte (the weight's) and a signed one (x's) into each 32-bit
   lane. So a lane holds 4 consecutive k of one column:
     int8: codes[strip][k' / 4][STRIP][4] (k' = k padded to a whole block with zero codes),
           each code stored + 128 as an unsigned byte; scales[strip][STRIP];
     int4: codes[strip][k / 8][STRIP][4], byte j of a lane holding code k + j (low nibble)
           and k + 4 + j (high), for k a multiple of 8; scales and lows as the float build's.
   The + 128 adds 128 * (the block's sum of x's codes) to an int8 block's integer sum: one
   number per row and block, so each row's block sum starts from minus it and the weight needs
   no extra data (x + 128 instead would need every column's block sums of codes). Per block
   the integer sums become floats times x's block scale; int4 adds its minima times the
   block's sum of the quantized x. Every INT_ROWS rows of x run over a strip's codes straight
   from memory, one row included. On a 2-core AVX512-VNNI Xeon, one thread, SmolLM2's shapes
   took 1/2 to 1/3 of the float build's time at one row, 1/3 (int8) to 1/2.5 (int4) at 64
   (bench/quantized_matmul.py --vnni).

   The threads are OpenMP's: linked against libgomp, which resolves to the copy torch has
   already loaded, they are torch's own pool. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef WIDTH
#define WIDTH 8
#endif
#ifndef VNNI
#define VNNI 0
#endif
#define STRIP (2 * WIDTH) /* a strip is two vector registers of WIDTH floats */
#define ROWS 6 /* rows of x per pass over a strip: 2 * ROWS accumulator registers */
#define GROUP 32
#define CHAINS 4
#ifndef DIRECT_ROWS
#define DIRECT_ROWS 12 /* int8 with at most this many rows reads codes straight (`multiply`) */
#endif

#if WIDTH == 16 /* AVX-512: zmm registers */
typedef __m512 floats;
#define load _mm512_loadu_ps
#define save _mm512_storeu_ps
#define zero _mm512_setzero_ps
#define broadcast _mm512_set1_ps
#define fma _mm512_fmadd_ps
#define add _mm512_add_ps
#define mul _mm512_mul_ps
#define signed_codes(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define widen_codes(c) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c))
#define load_bytes(p) _mm_loadu_si128((const __m128i *)(p))
#define nibbles_high(c) _mm_and_si128(_mm_srli_epi16(c, 4), _mm_set1_epi8(0x0F))
#define nibbles_low(c) _mm_and_si128(c, _mm_set1_epi8(0x0F))
typedef __m512i ints;
#define load_ints(p) _mm512_loadu_si512((const void *)(p))
#define broadcast_int _mm512_set1_epi32
#define dot_bytes _mm512_dpbusd_epi32 /* + unsigned bytes . signed bytes, 4 a lane */
#define to_floats _mm512_cvtepi32_ps
#define lanes_low(v) _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
#define lanes_high(v) _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F))
#define magnitude _mm512_abs_ps
#define larger _mm512_max_ps
#define largest_lane _mm512_reduce_max_ps
#define rounded _mm512_cvtps_epi32 /* to nearest */
#define add_ints _mm512_add_epi32
#define sum_lanes _mm512_reduce_add_epi32
/* A block's 32 int32 codes (two vectors), each within int8, as 32 bytes at p. */
#define store_block(p, c)                                                        \
    do {                                                                         \
        _mm_storeu_si128((__m128i *)(p), _mm512_cvtepi32_epi8((c)[0]));          \
        _mm_storeu_si128((__m128i *)(p) + 1, _mm512_cvtepi32_epi8((c)[1]));      \
    } while (0)
#elif WIDTH == 8 /* AVX2: ymm registers */
typedef __m256 floats;
#define load _mm256_loadu_ps
#define save _mm256_storeu_ps
#define zero _mm256_setzero_ps
#define broadcast _mm256_set1_ps
#define fma _mm256_fmadd_ps
#define add _mm256_add_ps
#define mul _mm256_mul_ps
#define signed_codes(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define widen_codes(c) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c))
#define load_bytes(p) _mm_loadl_epi64((const __m128i *)(p))
#define nibbles_high(c) _mm_and_si128(_mm_srli_epi16(c, 4), _mm_set1_epi8(0x0F))
#define nibbles_low(c) _mm_and_si128(c, _mm_set1_epi8(0x0F))
typedef __m256i ints;
#define load_ints(p) _mm256_loadu_si256((const __m256i *)(p))
#define broadcast_int _mm256_set1_epi32
#define dot_bytes _mm256_dpbusd_avx_epi32 /* + unsigned bytes . signed bytes, 4 a lane */
#define to_floats _mm256_cvtepi32_ps
#define lanes_low(v) _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
#define lanes_high(v) _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F))
#define magnitude(v) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)
#define larger _mm256_max_ps
#define rounded _mm256_cvtps_epi32 /* to nearest */
#define add_ints _mm256_add_epi32
static inline float largest_lane(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
static inline int32_t sum_lanes(__m256i v) {
    __m128i m = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(m, _mm_shuffle_epi32(m, 0xB1)));
}
/* A block's 32 int32 codes (four vectors), each within int8, as 32 bytes at p: the packs
   work per 128-bit lane, the permutation puts the lanes back in order. */
#define store_block(p, c)                                                                  \
    _mm256_storeu_si256((__m256i *)(p),                                                    \
                        _mm256_permutevar8x32_epi32(                                       \
                            _mm256_packs_epi16(_mm256_packs_epi32((c)[0], (c)[1]),         \
                                               _mm256_packs_epi32((c)[2], (c)[3])),        \
                            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)))
#else
#error "WIDTH must be 8 (AVX2) or 16 (AVX-512)"
#endif

/* A strip's two accumulators into y's first `width` columns, times scales[col] if given. */
static inline __attribute__((always_inline)) void store_strip(floats lo, floats hi,
                                                              const float *scales, float *y,
                                                              int width) {
    if (scales) {
        lo = mul(lo, load(scales));
        hi = mul(hi, load(scales + WIDTH));
    }
    float part[STRIP];
    float *out = width == STRIP ? y : part;
    save(out, lo);
    save(out + WIDTH, hi);
    if (out == part) memcpy(y, part, sizeof(float) * width);
}

/* Runs `call(n)` for every `most` rows of m starting at `r`, n rows (1..most, a constant at
   each call, so its loops unroll): `cases` is UP_TO_4 or UP_TO_6, as `most`. */
#define UP_TO_4(call) case 4: call(4); break; case 3: call(3); break; case 2: call(2); break; \
    default: call(1);
#define UP_TO_6(call) case 6: call(6); break; case 5: call(5); break; UP_TO_4(call)
#define FOR_EACH_ROWS(m, most, cases, r, call) \
    for (int64_t r = 0; r < (m); r += (most)) \
        switch ((m) - r < (most) ? (m) - r : (most)) { cases(call) }

#if !VNNI /* ---------------------------- float builds ---------------------------- */

static void dequantize_int8(const int8_t *codes, int64_t k, float *out) {
    for (int64_t i = 0; i < k * STRIP; i += WIDTH) save(out + i, signed_codes(codes + i));
}

static void dequantize_int4(const uint8_t *codes, const float *scales, const float *lows,
                            int64_t k, float *out) {
    for (int64_t g = 0; g < k / GROUP; g++)
        for (int half = 0; half < 2; half++) {
            int64_t at = g * STRIP + half * WIDTH;
            floats s = load(scales + at), m = load(lows + at);
            for (int64_t p = g * GROUP / 2; p < (g + 1) * GROUP / 2; p++) {
                __m128i c = load_bytes(codes + p * STRIP + half * WIDTH);
                float *pair = out + 2 * p * STRIP + half * WIDTH;
                save(pair, fma(widen_codes(nibbles_high(c)), s, m));
                save(pair + STRIP, fma(widen_codes(nibbles_low(c)), s, m));
            }
        }
}

/* `rows` (1..ROWS) rows of x times the dequantized strip w [k][STRIP], into y (row stride
   ldy), the first `width` columns only, each times scales[col] when scales is given. Inlined
   with a constant `rows` at each call, so its loops unroll. With few rows, each accumulator
   would wait on its previous add: then `chains` accumulators per row take alternate k. */
static inline __attribute__((always_inline)) void multiply_rows(
    const float *x, int64_t ldx, const int rows, const float *w, const int8_t *q, int64_t k,
    const float *scales, float *y, int64_t ldy, int width) {
    const int chains = rows == 1 ? CHAINS : rows <= 3 ? 2 : 1;
    floats acc[ROWS][CHAINS][2];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < chains; c++) acc[r][c][0] = acc[r][c][1] = zero();
    int64_t i = 0;
    for (; i + chains <= k; i += chains)
        for (int c = 0; c < chains; c++) {
            floats w0, w1;
            if (q) {
                w0 = signed_codes(q + (i + c) * STRIP);
                w1 = signed_codes(q + (i + c) * STRIP + WIDTH);
            } else {
                w0 = load(w + (i + c) * STRIP);
                w1 = load(w + (i + c) * STRIP + WIDTH);
            }
            for (int r = 0; r < rows; r++) {
                floats xr = broadcast(x[r * ldx + i + c]);
                acc[r][c][0] = fma(xr, w0, acc[r][c][0]);
                acc[r][c][1] = fma(xr, w1, acc[r][c][1]);
            }
        }
    for (; i < k; i++) {
        floats w0 = q ? signed_codes(q + i * STRIP) : load(w + i * STRIP);
        floats w1 = q ? signed_codes(q + i * STRIP + WIDTH) : load(w + i * STRIP + WIDTH);
        for (int r = 0; r < rows; r++) {
            floats xr = broadcast(x[r * ldx + i]);
            acc[r][0][0] = fma(xr, w0, acc[r][0][0]);
            acc[r][0][1] = fma(xr, w1, acc[r][0][1]);
        }
    }
    for (int r = 0; r < rows; r++) {
        floats lo = acc[r][0][0], hi = acc[r][0][1];
        for (int c = 1; c < chains; c++) {
            lo = add(lo, acc[r][c][0]);
            hi = add(hi, acc[r][c][1]);
        }
        store_strip(lo, hi, scales, y + r * ldy, width);
    }
}

/* Every row of x times a strip: from the float buffer w, or straight from int8 codes q when
   q is given (few rows, which would not repay converting the strip once into w). */
static void multiply(const float *x, int64_t ldx, int64_t m, const float *w, const int8_t *q,
                     int64_t k, const float *scales, float *y, int64_t ldy, int width) {
#define MULTIPLY_ROWS(n) multiply_rows(x + r * ldx, ldx, n, w, q, k, scales, y + r * ldy, ldy, width)
    FOR_EACH_ROWS(m, ROWS, UP_TO_6, r, MULTIPLY_ROWS)
}

/* One row of x (decoding one sequence) times a strip, straight from its codes: a single row
   gains nothing from the float buffer, which it would read once. int4 sums x * code per group
   and then applies the group's scale, and its minimum times the group's sum of x (`xsums`). */
static void multiply_one_row(int mode, const float *x, int64_t k, const void *codes,
                             const float *scales, const float *lows, const float *xsums,
                             float *y, int width) {
    floats acc[CHAINS][2];
    for (int c = 0; c < CHAINS; c++) acc[c][0] = acc[c][1] = zero();
    if (mode == 8) {
        const int8_t *q = codes;
        int64_t i = 0;
        for (; i + CHAINS <= k; i += CHAINS)
            for (int c = 0; c < CHAINS; c++) {
                floats xv = broadcast(x[i + c]);
                acc[c][0] = fma(xv, signed_codes(q + (i + c) * STRIP), acc[c][0]);
                acc[c][1] = fma(xv, signed_codes(q + (i + c) * STRIP + WIDTH), acc[c][1]);
            }
        for (; i < k; i++) {
            floats xv = broadcast(x[i]);
            acc[0][0] = fma(xv, signed_codes(q + i * STRIP), acc[0][0]);
            acc[0][1] = fma(xv, signed_codes(q + i * STRIP + WIDTH), acc[0][1]);
        }
    } else {
        const uint8_t *q = codes;
        for (int64_t g = 0; g < k / GROUP; g++) {
            floats part[2][2] = {{zero(), zero()}, {zero(), zero()}};
            for (int64_t p = g * GROUP / 2; p < (g + 1) * GROUP / 2; p++)
                for (int half = 0; half < 2; half++) {
                    __m128i c = load_bytes(q + p * STRIP + half * WIDTH);
                    part[0][half] = fma(broadcast(x[2 * p]), widen_codes(nibbles_high(c)),
                                        part[0][half]);
                    part[1][half] = fma(broadcast(x[2 * p + 1]), widen_codes(nibbles_low(c)),
                                        part[1][half]);
                }
            int chain = (int)(g % CHAINS);
            for (int half = 0; half < 2; half++) {
                int64_t at = g * STRIP + half * WIDTH;
                floats sums = add(part[0][half], part[1][half]);
                acc[chain][half] = fma(sums, load(scales + at), acc[chain][half]);
                acc[chain][half] = fma(broadcast(xsums[g]), load(lows + at), acc[chain][half]);
            }
        }
        scales = NULL; /* applied per group */
    }
    floats lo = add(add(acc[0][0], acc[1][0]), add(acc[2][0], acc[3][0]));
    floats hi = add(add(acc[0][1], acc[1][1]), add(acc[2][1], acc[3][1]));
    store_strip(lo, hi, scales, y, width);
}

/* The float builds' product: see the header. */
static int float_matmul(int mode, const float *x, int64_t m, int64_t ldx, int64_t k,
                        const void *codes, const float *scales, const float *lows, int64_t n,
                        float *y) {
    int64_t strips = (n + STRIP - 1) / STRIP, groups = k / GROUP;
    float *xsums = NULL;
    if (m == 1 && mode == 4) {
        xsums = malloc(sizeof(float) * (groups ? groups : 1));
        if (!xsums) return 1;
        for (int64_t g = 0; g < groups; g++) {
            float sum = 0;
            for (int64_t i = g * GROUP; i < (g + 1) * GROUP; i++) sum += x[i];
            xsums[g] = sum;
        }
    }
    int failed = 0;
#pragma omp parallel
    {
        int buffered = m > (mode == 8 ? DIRECT_ROWS : 1);
        float *w = buffered ? aligned_alloc(64, sizeof(float) * STRIP * k) : NULL;
        if (buffered && !w) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t s = 0; s < strips; s++) {
            int width = (int)(n - s * STRIP < STRIP ? n - s * STRIP : STRIP);
            const void *strip_codes = mode == 8 ? (const void *)((const int8_t *)codes + s * k * STRIP)
                                                : (const void *)((const uint8_t *)codes + s * (k / 2) * STRIP);
            const float *strip_scales = scales + s * (mode == 8 ? 1 : groups) * STRIP;
            const float *strip_lows = mode == 8 ? NULL : lows + s * groups * STRIP;
            if (m == 1) {
                multiply_one_row(mode, x, k, strip_codes, strip_scales, strip_lows, xsums,
                                 y + s * STRIP, width);
                continue;
            }
            if (mode == 8 && m <= DIRECT_ROWS) {
                multiply(x, ldx, m, NULL, strip_codes, k, strip_scales, y + s * STRIP, n, width);
                continue;
            }
            if (!w) continue;
            if (mode == 8)
                dequantize_int8(strip_codes, k, w);
            else
                dequantize_int4(strip_codes, strip_scales, strip_lows, k, w);
            multiply(x, ldx, m, w, NULL, k, mode == 8 ? strip_scales : NULL, y + s * STRIP, n,
                     width);
        }
        free(w);
    }
    free(xsums);
    return failed;
}

#else /* ----------------------------- VNNI builds ------------------------------ */

#define QUAD 4 /* k per 32-bit lane of vpdpbusd */
#define INT_ROWS 4 /* rows of x per pass, 2 int and 2 float accumulators each (6: no faster) */

/* x quantized row by row, per block of GROUP k (the last one padded with zero codes). */
typedef struct {
    int8_t *codes;    /* [m][blocks * GROUP]: x ~= code * its block's scale */
    float *scales;    /* [m][blocks] */
    int32_t *offsets; /* [m][blocks]: -128 * the block's sum of codes (int8 weights are + 128) */
    float *sums;      /* [m][blocks]: scale * sum of codes, which int4's minima multiply */
    int64_t blocks;
} activations;

/* Row r of x into `a`, codes rounded to nearest. A block whose largest |x| is under 1e-30
   (127 / it would overflow) is kept as zeros. int4's minima take the sum of the quantized x,
   not of x (llama.cpp's Q8_1 does the same): the product is then that of the weight and the
   quantized x, whose error is w * (x - x') as int8's, where the sum of x would leave
   (w - low) * (x - x'), about twice as large. */
static void quantize_row(const float *x, int64_t k, const activations *a, int64_t r) {
    float tail[GROUP];
    for (int64_t b = 0; b < a->blocks; b++) {
        int64_t at = b * GROUP, i = r * a->blocks + b;
        const float *block = x + at;
        if (k - at < GROUP) { /* the last block, partial: padded with zeros */
            memset(tail, 0, sizeof tail);
            memcpy(tail, block, sizeof(float) * (size_t)(k - at));
            block = tail;
        }
        floats values[GROUP / WIDTH], most = zero();
        for (int j = 0; j < GROUP / WIDTH; j++) {
            values[j] = load(block + j * WIDTH);
            most = larger(most, magnitude(values[j]));
        }
        float largest = largest_lane(most);
        floats inverse = broadcast(largest > 1e-30f ? 127.0f / largest : 0.0f);
        ints codes[GROUP / WIDTH], total = broadcast_int(0);
        for (int j = 0; j < GROUP / WIDTH; j++) {
            codes[j] = rounded(mul(values[j], inverse));
            total = add_ints(total, codes[j]);
        }
        store_block(a->codes + r * a->blocks * GROUP + at, codes);
        int32_t sum = sum_lanes(total);
        a->scales[i] = largest / 127.0f;
        a->offsets[i] = -128 * sum;
        a->sums[i] = a->scales[i] * (float)sum;
    }
}

/* Four of row r's codes from k, in every 32-bit lane: one operand of vpdpbusd. */
static inline __attribute__((always_inline)) ints quad(const activations *a, int64_t r,
                                                       int64_t k) {
    int32_t four;
    memcpy(&four, a->codes + r * a->blocks * GROUP + k, sizeof four);
    return broadcast_int(four);
}

/* Rows r0.. (`rows`, 1..INT_ROWS) of x times a strip of int8 codes [k' / 4][STRIP][4], each
   stored + 128, into y (row stride ldy). Inlined with a constant `rows`, so its loops unroll. */
static inline __attribute__((always_inline)) void multiply_int8(
    const activations *a, int64_t r0, const int rows, const uint8_t *w, const float *scales,
    float *y, int64_t ldy, int width) {
    floats acc[INT_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = zero();
    for (int64_t b = 0; b < a->blocks; b++) {
        ints sum[INT_ROWS][2];
        for (int r = 0; r < rows; r++)
            sum[r][0] = sum[r][1] = broadcast_int(a->offsets[(r0 + r) * a->blocks + b]);
        for (int q = 0; q < GROUP / QUAD; q++) {
            const uint8_t *at = w + (b * GROUP / QUAD + q) * STRIP * QUAD;
            ints w0 = load_ints(at), w1 = load_ints(at + WIDTH * QUAD);
            for (int r = 0; r < rows; r++) {
                ints xq = quad(a, r0 + r, b * GROUP + q * QUAD);
                sum[r][0] = dot_bytes(sum[r][0], w0, xq);
                sum[r][1] = dot_bytes(sum[r][1], w1, xq);
            }
        }
        for (int r = 0; r < rows; r++) {
            floats dx = broadcast(a->scales[(r0 + r) * a->blocks + b]);
            acc[r][0] = fma(to_floats(sum[r][0]), dx, acc[r][0]);
            acc[r][1] = fma(to_floats(sum[r][1]), dx, acc[r][1]);
        }
    }
    for (int r = 0; r < rows; r++) store_strip(acc[r][0], acc[r][1], scales, y + r * ldy, width);
}

/* As `multiply_int8` for a strip of int4 codes [k / 8][STRIP][4] (two k a byte), its scales
   and minima [group][STRIP]. */
static inline __attribute__((always_inline)) void multiply_int4(
    const activations *a, int64_t r0, const int rows, const uint8_t *w, const float *scales,
    const float *lows, float *y, int64_t ldy, int width) {
    floats acc[INT_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = zero();
    for (int64_t g = 0; g < a->blocks; g++) {
        ints sum[INT_ROWS][2];
        for (int r = 0; r < rows; r++)
            for (int half = 0; half < 2; half++) sum[r][half] = broadcast_int(0);
        for (int o = 0; o < GROUP / (2 * QUAD); o++)
            for (int half = 0; half < 2; half++) {
                ints both = load_ints(w + ((g * GROUP / (2 * QUAD) + o) * STRIP + half * WIDTH) * QUAD);
                ints first = lanes_low(both), second = lanes_high(both);
                for (int r = 0; r < rows; r++) {
                    int64_t k = g * GROUP + o * 2 * QUAD;
                    sum[r][half] = dot_bytes(sum[r][half], first, quad(a, r0 + r, k));
                    sum[r][half] = dot_bytes(sum[r][half], second, quad(a, r0 + r, k + QUAD));
                }
            }
        for (int half = 0; half < 2; half++) {
            floats scale = load(scales + g * STRIP + half * WIDTH);
            floats low = load(lows + g * STRIP + half * WIDTH);
            for (int r = 0; r < rows; r++) {
                int64_t i = (r0 + r) * a->blocks + g;
                floats product = to_floats(sum[r][half]);
                acc[r][half] = fma(product, mul(scale, broadcast(a->scales[i])), acc[r][half]);
                acc[r][half] = fma(low, broadcast(a->sums[i]), acc[r][half]);
            }
        }
    }
    for (int r = 0; r < rows; r++) store_strip(acc[r][0], acc[r][1], NULL, y + r * ldy, width);
}

/* Every row of the quantized x times one strip. */
static void multiply_strip(int mode, const activations *a, int64_t m, const uint8_t *codes,
                           const float *scales, const float *lows, float *y, int64_t n,
                           int width) {
#define INT8_ROWS(rows) multiply_int8(a, r, rows, codes, scales, y + r * n, n, width)
#define INT4_ROWS(rows) multiply_int4(a, r, rows, codes, scales, lows, y + r * n, n, width)
    if (mode == 8)
        FOR_EACH_ROWS(m, INT_ROWS, UP_TO_4, r, INT8_ROWS)
    else
        FOR_EACH_ROWS(m, INT_ROWS, UP_TO_4, r, INT4_ROWS)
}

/* The VNNI builds' product: see the header. */
static int integer_matmul(int mode, const float *x, int64_t m, int64_t ldx, int64_t k,
                          const void *codes, const float *scales, const float *lows,
                          int64_t n, float *y) {
    int64_t strips = (n + STRIP - 1) / STRIP, blocks = (k + GROUP - 1) / GROUP;
    int64_t cells = m * blocks > 0 ? m * blocks : 1;
    activations a = {malloc(cells * GROUP), malloc(sizeof(float) * cells),
                     malloc(sizeof(int32_t) * cells), malloc(sizeof(float) * cells), blocks};
    int failed = !a.codes || !a.scales || !a.offsets || !a.sums;
    if (!failed) {
#pragma omp parallel
        {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < m; r++) quantize_row(x + r * ldx, k, &a, r);
#pragma omp for schedule(static)
            for (int64_t s = 0; s < strips; s++) {
                int width = (int)(n - s * STRIP < STRIP ? n - s * STRIP : STRIP);
                int64_t bytes = mode == 8 ? blocks * GROUP * STRIP : k / 2 * STRIP;
                int64_t floats_per_strip = (mode == 8 ? 1 : blocks) * STRIP;
                multiply_strip(mode, &a, m, (const uint8_t *)codes + s * bytes,
                               scales + s * floats_per_strip,
                               mode == 8 ? NULL : lows + s * floats_per_strip, y + s * STRIP,
                               n, width);
            }
        }
    }
    free(a.codes);
    free(a.scales);
    free(a.offsets);
    free(a.sums);
    return failed;
}

#endif

/* The column count of a strip this build lays weights out in. */
int quantized_matmul_strip(void) { return STRIP; }

/* 1 when this build multiplies quantized x with VNNI (and reads the VNNI layouts), else 0. */
int quantized_matmul_vnni(void) { return VNNI; }

/* x [m, k] float32 (rows `ldx` apart), y [m, n] float32 (contiguous). mode 8: int8 codes,
   scales [strips][STRIP], lows unused; mode 4: as the header says. 0 on success. */
int quantized_matmul(int mode, const float *x, int64_t m, int64_t ldx, int64_t k,
                     const void *codes, const float *scales, const float *lows, int64_t n,
                     float *y) {
#if VNNI
    return integer_matmul(mode, x, m, ldx, k, codes, scales, lows, n, y);
#else
    return float_matmul(mode, x, m, ldx, k, codes, scales, lows, n, y);
#endif
}
