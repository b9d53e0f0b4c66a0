/* StepFrame's row order and per-row column reads in one pass each (built by
   invariants/compiled.py, wrapped by sort_kernels.py; the numpy of invariants/frame.py
   is the definition, and tests/test_compiled_sort.py holds every array here equal to it).

   Shapes: R rows; order [R] (sorted row r is batch row order[r]), inv [R] its inverse;
   K request-id dictionary codes plus the null slot (codes [R]: a code < 0 is a null id and
   reads entry K - 1, numpy's negative index). Codes and steps come as C: int32 as the
   contract writes them, or int64 (the wrapper widens any other case), one function per width.

     sort_rows:   a stable counting sort of the rows by their request's rank; -> whether the
                  steps ascend inside each request (else the caller runs np.lexsort)
     sorted_rows: step, request-id code, carry slot and row_in_file per sorted row; inv
     take_rows:   columns gathered into sorted order, a block of rows at a time
     common_length: the length every list of an int32 offsets array has, or -1
     rows_same:   whether every row of a block of uint64 words equals its first row */
#include <stdint.h>

typedef int64_t i64;
typedef int32_t i32;
typedef uint8_t u8;

/* rank [K], cnt [K + 1] zeroed scratch; writes order [R] */
#define SORT_ROWS(NAME, C)                                                                  \
i64 NAME(i64 R, i64 K, const C *codes, const i64 *rank, const C *step, i64 *cnt, i64 *order) \
{                                                                                           \
    for (i64 b = 0; b < R; b++) {                                                           \
        i64 c = codes[b];                                                                   \
        cnt[rank[c < 0 ? c + K : c] + 1]++;                                                 \
    }                                                                                       \
    for (i64 k = 0; k < K; k++) cnt[k + 1] += cnt[k];                                       \
    for (i64 b = 0; b < R; b++) {                                                           \
        i64 c = codes[b];                                                                   \
        order[cnt[rank[c < 0 ? c + K : c]]++] = b;                                          \
    }                                                                                       \
    /* steps ascend inside each request: the writer's order, the usual batch */             \
    for (i64 r = 1; r < R; r++) {                                                           \
        i64 c0 = codes[order[r - 1]], c1 = codes[order[r]];                                 \
        if (rank[c0 < 0 ? c0 + K : c0] == rank[c1 < 0 ? c1 + K : c1]                       \
            && step[order[r]] < step[order[r - 1]]) return 0;                               \
    }                                                                                       \
    return 1;                                                                               \
}
SORT_ROWS(sort_rows_w, i32)
SORT_ROWS(sort_rows_l, i64)

/* order [R], codes [R], gidx [K], step [R] -> step_s, rid_s, req_s, row_in_file [R]
   sorted, inv [R] */
#define SORTED_ROWS(NAME, C)                                                                \
void NAME(i64 R, i64 K, const i64 *order, const C *codes, const i64 *gidx, const C *step,   \
          i64 row_offset, i64 *step_s, i64 *rid_s, i64 *req_s, i64 *inv, i64 *row_in_file)  \
{                                                                                           \
    for (i64 r = 0; r < R; r++) {                                                           \
        i64 b = order[r], c = codes[b];                                                     \
        step_s[r] = step[b];                                                                \
        rid_s[r] = c;                                                                       \
        req_s[r] = gidx[c < 0 ? c + K : c];                                                 \
        inv[b] = r;                                                                         \
        row_in_file[r] = b + row_offset;                                                    \
    }                                                                                       \
}
SORTED_ROWS(sorted_rows_w, i32)
SORTED_ROWS(sorted_rows_l, i64)

/* what take_rows reads from each column's source (src [Q], the array's address) and writes
   to its destination (dst [Q]) at sorted row r from batch row b = order[r] */
enum { I32_I64 = 0,   /* int32 value -> int64 */
       W8 = 1,        /* an 8-byte value (int64, uint64) as it is */
       W1 = 2,        /* a 1-byte value (bool) as it is */
       LEN32 = 3,     /* int32 offsets [R + 1]: off[b + 1] - off[b] -> int64 */
       START32 = 4 }; /* int32 offsets [R + 1]: off[b] - off[0] -> int64 */

#define BLOCK 2048
void take_rows(i64 R, const i64 *order, i64 Q, const i64 *kind, const uint64_t *src, const uint64_t *dst)
{
    for (i64 r0 = 0; r0 < R; r0 += BLOCK) {
        i64 r1 = r0 + BLOCK < R ? r0 + BLOCK : R;
        const i64 *o = order;
        for (i64 q = 0; q < Q; q++) {
            const void *s = (const void *)(uintptr_t)src[q];
            void *d = (void *)(uintptr_t)dst[q];
            switch (kind[q]) {
            case I32_I64: { const i32 *a = s; i64 *z = d; for (i64 r = r0; r < r1; r++) z[r] = a[o[r]]; break; }
            case W8: { const i64 *a = s; i64 *z = d; for (i64 r = r0; r < r1; r++) z[r] = a[o[r]]; break; }
            case W1: { const u8 *a = s; u8 *z = d; for (i64 r = r0; r < r1; r++) z[r] = a[o[r]]; break; }
            case LEN32: { const i32 *a = s; i64 *z = d;
                for (i64 r = r0; r < r1; r++) z[r] = (i64)a[o[r] + 1] - (i64)a[o[r]]; break; }
            case START32: { const i32 *a = s; i64 *z = d; i64 a0 = a[0];
                for (i64 r = r0; r < r1; r++) z[r] = (i64)a[o[r]] - a0; break; }
            default: break;
            }
        }
    }
}

/* off [R + 1] int32 -> the length of every list when they are all that long, else -1
   (R >= 1) */
i64 common_length(i64 R, const i32 *off)
{
    i64 n = (i64)off[1] - (i64)off[0];
    for (i64 b = 1; b < R; b++)
        if ((i64)off[b + 1] - (i64)off[b] != n) return -1;
    return n;
}

/* V [R, D] uint64 words (R >= 1) -> 1 when every row equals row 0 (group_rows' one group:
   a chain batch, a static tree), else 0. No early exit: the usual answer is 1, and an
   OR of differences runs as wide as the compiler makes it */
i64 rows_same(i64 R, i64 D, const uint64_t *V)
{
    uint64_t diff = 0;
    for (i64 r = 1; r < R; r++)
        for (i64 d = 0; d < D; d++) diff |= V[r * D + d] ^ V[d];
    return diff == 0;
}

/* row_groups.group_rows's fingerprints: V [R, D] uint64 words of a block's rows, w [D]
   -> fp [R] = V @ w, wrapping (numpy's uint64 matmul, bit for bit) */
void row_fingerprints(i64 R, i64 D, const uint64_t *V, const uint64_t *w, uint64_t *fp)
{
    for (i64 r = 0; r < R; r++) {
        const uint64_t *v = V + r * D;
        uint64_t s = 0;
        for (i64 d = 0; d < D; d++) s += v[d] * w[d];
        fp[r] = s;
    }
}

/* cands [U] sorted (distinct fingerprints of the first rows), first [U] a row of each:
   ids [R] = np.searchsorted(cands, fp) capped at U - 1, each row's fingerprint fp (as
   row_fingerprints) computed on the way. -> the number of rows whose fingerprint is not
   in cands or whose words differ from their group's first row (0: ids are group_rows'
   answer; else the caller's numpy decides) */
i64 row_lookup(i64 R, i64 D, const uint64_t *V, const uint64_t *w, i64 U, const uint64_t *cands,
               const i64 *first, i64 *ids)
{
    i64 bad = 0;
    for (i64 r = 0; r < R; r++) {
        const uint64_t *v = V + r * D;
        uint64_t x = 0;
        for (i64 d = 0; d < D; d++) x += v[d] * w[d];
        /* the first cands[i] >= x: a binary search without branches (U >= 1) */
        const uint64_t *base = cands;
        for (i64 n = U; n > 1; ) {
            i64 half = n / 2;
            base = base[half] < x ? base + half : base;
            n -= half;
        }
        i64 lo = (base - cands) + (*base < x);
        i64 pos = lo < U - 1 ? lo : U - 1;
        ids[r] = pos;
        if (cands[pos] != x) { bad++; continue; }
        const uint64_t *a = V + r * D, *b = V + first[pos] * D;
        for (i64 d = 0; d < D; d++)
            if (a[d] != b[d]) { bad++; break; }
    }
    return bad;
}
