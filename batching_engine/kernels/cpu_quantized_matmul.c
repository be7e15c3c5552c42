/* y = x @ w.T for weights held as int8 rows or int4 groups, on an x86 CPU.

   torch's own weight-only CPU kernels took 6-8x (int8) and 16-19x (int4) float32's time for a
   SmolLM2 decode step on a 2-core AVX-512 EPYC (bench/quantized_matmul.py); this one runs at
   float32's speed with many rows and several times it with few, since it reads a quarter or
   an eighth of the bytes. One source builds for AVX2 (WIDTH 8: ymm registers) and AVX-512
   (WIDTH 16: zmm); cpu_quantized_matmul.py builds the one the CPU runs and packs the weights
   for it.

   Layout: the output columns (the weight's rows) are taken STRIP = 2 * WIDTH at a time, a
   "strip". A strip holds, for each input index k, the codes of its columns side by side:
     int8: codes[strip][k][STRIP], one scale per column: scales[strip][STRIP];
     int4: codes[strip][k / 2][STRIP], each byte the code of k (high nibble) and k + 1 (low),
           with a scale and a minimum per column and group of 32 k:
           scales[strip][group][STRIP], lows[strip][group][STRIP]; w = code * scale + low.
   The column count is padded to whole strips with zero codes; those outputs are dropped.

   Each thread takes whole strips, and per strip one of three ways:
   - one row of x (decoding one sequence): straight from the codes (`multiply_one_row`);
   - int8 with up to DIRECT_ROWS rows: straight from the codes, ROWS rows at a time;
   - more rows: the strip is converted once into a float buffer [k][STRIP] (L2-resident), then
     every ROWS rows of x run over it with 2 * ROWS vector accumulators.
   int8's scale multiplies the sums, not each weight.

   The threads are OpenMP's: linked against libgomp, which resolves to the copy torch has
   already loaded, they are torch's own pool. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef WIDTH
#define WIDTH 8
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
#else
#error "WIDTH must be 8 (AVX2) or 16 (AVX-512)"
#endif

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
        if (scales) {
            lo = mul(lo, load(scales));
            hi = mul(hi, load(scales + WIDTH));
        }
        float part[STRIP];
        float *out = width == STRIP ? y + r * ldy : part;
        save(out, lo);
        save(out + WIDTH, hi);
        if (out == part) memcpy(y + r * ldy, part, sizeof(float) * width);
    }
}

/* Every row of x times a strip: from the float buffer w, or straight from int8 codes q when
   q is given (few rows, which would not repay converting the strip once into w). */
static void multiply(const float *x, int64_t ldx, int64_t m, const float *w, const int8_t *q,
                     int64_t k, const float *scales, float *y, int64_t ldy, int width) {
    for (int64_t r = 0; r < m; r += ROWS) {
        const float *xr = x + r * ldx;
        float *yr = y + r * ldy;
#define ROWS_CASE(n) \
    case n: multiply_rows(xr, ldx, n, w, q, k, scales, yr, ldy, width); break;
        switch (m - r < ROWS ? m - r : ROWS) {
            ROWS_CASE(6) ROWS_CASE(5) ROWS_CASE(4) ROWS_CASE(3) ROWS_CASE(2)
            default: multiply_rows(xr, ldx, 1, w, q, k, scales, yr, ldy, width);
        }
    }
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
    if (scales) {
        lo = mul(lo, load(scales));
        hi = mul(hi, load(scales + WIDTH));
    }
    float part[STRIP];
    save(part, lo);
    save(part + WIDTH, hi);
    memcpy(y, part, sizeof(float) * width);
}

/* The column count of a strip this build lays weights out in. */
int quantized_matmul_strip(void) { return STRIP; }

/* x [m, k] float32 (rows `ldx` apart), y [m, n] float32 (contiguous). mode 8: int8 codes,
   scales [strips][STRIP], lows unused; mode 4: as the header says. 0 on success. */
int quantized_matmul(int mode, const float *x, int64_t m, int64_t ldx, int64_t k,
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
