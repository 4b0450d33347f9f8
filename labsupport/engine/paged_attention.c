/* Paged attention that reads the KV blocks in place (the CPU_ATTN backend of labsupport.engine).
 *
 * The same maths as labsupport/engine/attention.py (write the new K/V into their slots, then
 * softmax(q K^T * scale, causal) V per sequence), without the gather: instead of copying each
 * sequence's blocks into one contiguous tensor for torch's scaled_dot_product_attention, the
 * loops below follow the block table and read each key and value where it lies in the pool,
 * as vLLM's paged-attention kernels do (Kwon et al., 2023). attention.py stays the reference;
 * tests/test_native_attention.py checks this file against it.
 *
 * Layout (float32, all contiguous):
 *   qkv     (N, 3, H, D)  the new tokens' projections, q | k | v of a token in one row
 *   cache   (2, num_blocks, block_size, H, D)  one layer: K then V; a slot holds all heads of a token
 *   out     (N, H * D)    the attention output, heads concatenated
 * and, the same for every layer of a step, a StepPlan:
 *   slots   (N,)          flat slot of each new token: table[p / block_size] * block_size + p % block_size
 *   tables  (B, max_blocks) block ids of each sequence
 *   query_lens, context_lens (B,)  new tokens and keys after this step of each sequence; the new
 *           tokens of sequence b are rows sum(query_lens[:b]) ..., and its i-th new token sees
 *           keys 0 .. context_len - query_len + i (a causal chain; token trees use attention.py)
 *   scores  scratch of at least max(query_lens) * H * max(context_lens) floats
 *
 * One thread; no allocation; the caller (labsupport/engine/native_attention.py) checks shapes,
 * block ids and lengths before calling.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define D_MAX 256                 /* largest head size the kernel takes (GPT-2's is 64) */

typedef struct {                  /* what every layer of one step shares (native_attention.StepPlan) */
  int64_t num_blocks, block_size, heads, dim;
  const int64_t *slots, *tables;
  int64_t max_blocks;
  const int64_t *query_lens, *context_lens;
  int64_t num_seqs;
  float *scores;
} StepPlan;

/* e^x for x <= 0 (a score minus its row's maximum) as 2^n * e^r: n = round(x / ln 2) goes into the
 * float's exponent bits, r = x - n ln 2 (ln 2 in two parts, so r stays exact) lies in [-ln2/2, ln2/2],
 * where e^r is its Taylor polynomial of degree 7. Relative error < 2e-7 (measured: 1e-7), as expf's; written without a
 * library call so that the compiler runs it in vector lanes (expf's call was a third of a decode step's
 * attention). Below -87 the result would leave the float range: it is clamped there (e^-87 ~ 2e-38). */
static inline float exp_nonpositive(float x) {
  x = x < -87.f ? -87.f : x;
  const float n = __builtin_roundf(x * 1.44269504f);
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  float p = 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  union { float f; int32_t i; } two_n = {.i = ((int32_t)n + 127) << 23};
  return p * two_n.f;
}

/* Dot product of two head vectors; "omp simd" lets the compiler add in vector lanes. */
static inline float dot(const float *a, const float *b, int64_t D) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
  return s;
}

static inline void attend(const float *qkv, float *cache, int64_t num_blocks, int64_t block_size,
                          int64_t H, int64_t D, const int64_t *slots, const int64_t *tables,
                          int64_t max_blocks, const int64_t *query_lens, const int64_t *context_lens,
                          int64_t num_seqs, float scale, float *scores, float *out) {
  const int64_t slot_size = H * D, row = 3 * slot_size;
  float *k_cache = cache, *v_cache = cache + num_blocks * block_size * slot_size;

  /* 1. write: the new tokens' K and V into their slots */
  int64_t n_new = 0;
  for (int64_t b = 0; b < num_seqs; b++) n_new += query_lens[b];
  for (int64_t t = 0; t < n_new; t++) {
    memcpy(k_cache + slots[t] * slot_size, qkv + t * row + slot_size, sizeof(float) * slot_size);
    memcpy(v_cache + slots[t] * slot_size, qkv + t * row + 2 * slot_size, sizeof(float) * slot_size);
  }

  int64_t first_row = 0;
  for (int64_t b = 0; b < num_seqs; b++) {
    const int64_t *table = tables + b * max_blocks;
    const int64_t Q = query_lens[b], n = context_lens[b], cached = n - Q;  /* query i sees keys < cached + i + 1 */
    const float *q = qkv + first_row * row;
    float *o = out + first_row * slot_size;

    /* 2. scores[i][h][j] = scale * q_i,h . k_j,h, block by block through the table */
    for (int64_t j0 = 0; j0 < n; j0 += block_size) {
      const float *block = k_cache + table[j0 / block_size] * block_size * slot_size;
      const int64_t j_end = j0 + block_size < n ? j0 + block_size : n;
      for (int64_t j = j0; j < j_end; j++) {
        const float *k = block + (j - j0) * slot_size;
        for (int64_t i = j > cached ? j - cached : 0; i < Q; i++)         /* the queries that see key j */
          for (int64_t h = 0; h < H; h++)
            scores[(i * H + h) * n + j] = scale * dot(q + i * row + h * D, k + h * D, D);
      }
    }

    /* 3. softmax of each (query, head) row over the keys it sees */
    for (int64_t i = 0; i < Q; i++)
      for (int64_t h = 0; h < H; h++) {
        float *s = scores + (i * H + h) * n, m = -INFINITY, sum = 0.f;
        const int64_t len = cached + i + 1;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < len; j++) m = s[j] > m ? s[j] : m;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < len; j++) { s[j] = exp_nonpositive(s[j] - m); sum += s[j]; }
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t j = 0; j < len; j++) s[j] *= inv;
      }

    /* 4. out_i,h = sum_j p_ij v_j,h, values read in place; each output row is summed in registers */
    for (int64_t i = 0; i < Q; i++)
      for (int64_t h = 0; h < H; h++) {
        const float *p = scores + (i * H + h) * n;
        const int64_t len = cached + i + 1;
        float acc[D_MAX];
        for (int64_t d = 0; d < D; d++) acc[d] = 0.f;
        for (int64_t j0 = 0; j0 < len; j0 += block_size) {
          const float *v = v_cache + table[j0 / block_size] * block_size * slot_size + h * D;
          const int64_t j_end = j0 + block_size < len ? j0 + block_size : len;
          for (int64_t j = j0; j < j_end; j++, v += slot_size)
#pragma omp simd
            for (int64_t d = 0; d < D; d++) acc[d] += p[j] * v[d];
        }
        memcpy(o + i * slot_size + h * D, acc, sizeof(float) * D);
      }
    first_row += Q;
  }
}

void paged_attention_f32(const StepPlan *p, const float *qkv, float *cache, float scale, float *out) {
  if (p->dim == 64)   /* GPT-2's head size at every model size: a constant D lets the compiler unroll */
    attend(qkv, cache, p->num_blocks, p->block_size, p->heads, 64, p->slots, p->tables, p->max_blocks,
           p->query_lens, p->context_lens, p->num_seqs, scale, p->scores, out);
  else
    attend(qkv, cache, p->num_blocks, p->block_size, p->heads, p->dim, p->slots, p->tables, p->max_blocks,
           p->query_lens, p->context_lens, p->num_seqs, scale, p->scores, out);
}
