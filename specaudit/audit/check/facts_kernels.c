/* facts.py's per-request output facts in one pass per column (built by
   invariants/compiled.py, wrapped by facts_kernels.py; facts.py's numpy _token_facts is
   the definition). Lists come as their Arrow buffers: row i holds
   vals[off[i] .. off[i] + len[i]), len -1 for a null list (its values never read).
   Each function is written once per offset and value width (int32 or int64). */
#include <stdint.h>
#include "kernels_mix.h"

/* -> h [R] (token_mix summed over positions 1.., 0 for an empty or null output),
   first, last [R] (-1 when empty), eos_in [R] (the first eos before the last token,
   -1 when none) */
#define OUTPUT_FACTS(NAME, OFF_T, VAL_T)                                                   \
void NAME(int64_t R, const OFF_T *off, const VAL_T *vals, const int64_t *olen, int64_t eos, \
          uint64_t *h, int64_t *first, int64_t *last, int64_t *eos_in)                     \
{                                                                                          \
    for (int64_t i = 0; i < R; i++) {                                                      \
        int64_t n = olen[i];                                                               \
        h[i] = 0; first[i] = -1; last[i] = -1; eos_in[i] = -1;                             \
        if (n <= 0) continue;                                                              \
        const VAL_T *v = vals + (int64_t)off[i];                                           \
        first[i] = (int64_t)v[0];                                                          \
        last[i] = (int64_t)v[n - 1];                                                       \
        uint64_t acc = 0;                                                                  \
        for (int64_t j = 1; j < n; j++) acc += token_mix1((int64_t)v[j], j);               \
        h[i] = acc;                                                                        \
        for (int64_t j = 0; j < n - 1; j++)                                                \
            if ((int64_t)v[j] == eos) { eos_in[i] = j; break; }                            \
    }                                                                                      \
}
OUTPUT_FACTS(output_facts_o32_v32, int32_t, int32_t)
OUTPUT_FACTS(output_facts_o32_v64, int32_t, int64_t)
OUTPUT_FACTS(output_facts_o64_v32, int64_t, int32_t)
OUTPUT_FACTS(output_facts_o64_v64, int64_t, int64_t)

/* the output against reference_tokens (both as above, offsets O and values V of one
   width for both lists: the wrapper widens a mix) -> eq [R] (1 equal, 0 not, -1 no
   reference), diff [R] (the first position that differs, the shorter length when one is
   a prefix of the other, -1 when equal or no reference). A null output counts as empty. */
#define REFERENCE_FACTS(NAME, OFF_T, VAL_T)                                                \
void NAME(int64_t R, const OFF_T *off, const VAL_T *vals, const int64_t *olen,             \
          const OFF_T *roff, const VAL_T *rvals, const int64_t *rlen, int64_t *eq, int64_t *diff) \
{                                                                                          \
    for (int64_t i = 0; i < R; i++) {                                                      \
        eq[i] = -1; diff[i] = -1;                                                          \
        if (rlen[i] < 0) continue;                                                         \
        int64_t n = olen[i] > 0 ? olen[i] : 0, rn = rlen[i];                               \
        int64_t m = n < rn ? n : rn, d = -1;                                               \
        const VAL_T *a = vals + (int64_t)off[i], *b = rvals + (int64_t)roff[i];            \
        for (int64_t j = 0; j < m; j++)                                                    \
            if ((int64_t)a[j] != (int64_t)b[j]) { d = j; break; }                          \
        if (d < 0 && n != rn) d = m;                                                       \
        diff[i] = d;                                                                       \
        eq[i] = d < 0 ? 1 : 0;                                                             \
    }                                                                                      \
}
REFERENCE_FACTS(reference_facts_o32_v32, int32_t, int32_t)
REFERENCE_FACTS(reference_facts_o64_v64, int64_t, int64_t)
