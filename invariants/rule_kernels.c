/* "Is anything bad in this batch?" tests of the hottest step rules (built by
   invariants/compiled.py, wrapped by rule_kernels.py; each rule's numpy is the
   definition: when a test says 1 the rule runs its numpy, which finds the rows).

   Shapes as in StepFrame (invariants/frame.py): R rows; sorted rows r (by request,
   step) or batch rows b (the file's order; inv [R] maps b -> r); T flat nodes in batch
   order, sorted row r's at start[r] .. start[r] + n[r] - 1; a uniform-N batch's as
   [R, N0] blocks (block b is batch row b); P flat path entries, row r's at
   path_start[r] .. + path_len[r] - 1. Rows are visited in batch order: the flat
   arrays' memory order. Booleans are numpy's: one byte, 0 or 1. */
#include <stdint.h>

typedef int64_t i64;
typedef int32_t i32;
typedef uint8_t u8;

/* SA201 on a uniform-N batch of known shapes: any pos[b, i] != seq_len[inv[b]] +
   depth[ids[b], i] (ids empty, n_ids 0: every row is shape 0). pos [R, N0]. */
#define POSITIONS_BAD_UNIFORM(NAME, POS_T)                                                  \
i64 NAME(i64 R, i64 N0, const POS_T *pos, const i64 *seq_len, const i64 *inv,               \
         i64 n_ids, const i64 *ids, const i64 *depth)                                      \
{                                                                                          \
    for (i64 b = 0; b < R; b++) {                                                          \
        i64 want = seq_len[inv[b]];                                                        \
        const i64 *d = depth + (n_ids == 0 ? 0 : ids[b]) * N0;                             \
        const POS_T *p = pos + b * N0;                                                     \
        int bad = 0;                                                                       \
        for (i64 i = 0; i < N0; i++) bad |= (i64)p[i] != want + d[i];                      \
        if (bad) return 1;                                                                 \
    }                                                                                      \
    return 0;                                                                              \
}
POSITIONS_BAD_UNIFORM(positions_bad_uniform_p32, i32)
POSITIONS_BAD_UNIFORM(positions_bad_uniform_p64, i64)

/* SA201 on a uniform-N batch of chains (depth = node index), with seq_len in batch order
   (seq [R], the column as the file has it: no gather through inv): any pos[b, i] !=
   seq[b] + i. pos [R, N0]. Rows are tested in blocks of 256 (no exit inside a block: it
   vectorises), and the common N0 get a loop of constant length. */
#define BLOCK 256   /* rows tested between two exits of the blocked kernels */
/* N0 a constant for the common sizes (4, 8, 16): F(N, ...), an inline body with N nodes
   per row, gets its inner loops unrolled and vectorised. */
#define BY_N0(F, ...) switch (N0) { case 4: return F(4, __VA_ARGS__); case 8: return F(8, __VA_ARGS__); \
                                    case 16: return F(16, __VA_ARGS__); default: return F(N0, __VA_ARGS__); }
#define POSITIONS_BAD_CHAIN(NAME, POS_T, SEQ_T)                                             \
static inline i64 NAME##_n(i64 N, i64 R, const POS_T *pos, const SEQ_T *seq)               \
{                                                                                          \
    for (i64 b0 = 0; b0 < R; b0 += BLOCK) {                                                \
        i64 e = b0 + BLOCK < R ? b0 + BLOCK : R;                                           \
        int bad = 0;                                                                       \
        for (i64 b = b0; b < e; b++) {                                                     \
            i64 want = (i64)seq[b];                                                        \
            const POS_T *p = pos + b * N;                                                  \
            for (i64 i = 0; i < N; i++) bad |= (i64)p[i] != want + i;                      \
        }                                                                                  \
        if (bad) return 1;                                                                 \
    }                                                                                      \
    return 0;                                                                              \
}                                                                                          \
i64 NAME(i64 R, i64 N0, const POS_T *pos, const SEQ_T *seq) { BY_N0(NAME##_n, R, pos, seq) }
POSITIONS_BAD_CHAIN(positions_bad_chain_p32_s32, i32, i32)
POSITIONS_BAD_CHAIN(positions_bad_chain_p32_s64, i32, i64)
POSITIONS_BAD_CHAIN(positions_bad_chain_p64_s32, i64, i32)
POSITIONS_BAD_CHAIN(positions_bad_chain_p64_s64, i64, i64)

/* SA201 on any batch: each node's depth from the safe parents (parent_in_row [T], an
   earlier node of the row, -1 at a root), then any pos[start[r] + i] != seq_len[r] +
   depth. dep: scratch of max(n) entries (at least 1). */
#define POSITIONS_BAD_PARENTS(NAME, POS_T)                                                  \
i64 NAME(i64 R, const POS_T *pos, const i64 *seq_len, const i64 *start, const i64 *n,       \
         const i64 *parent_in_row, const i64 *inv, i64 *dep)                                \
{                                                                                          \
    for (i64 b = 0; b < R; b++) {                                                          \
        i64 r = inv[b], s = start[r], want = seq_len[r];                                   \
        int bad = 0;                                                                       \
        for (i64 i = 0; i < n[r]; i++) {                                                   \
            i64 p = parent_in_row[s + i];                                                  \
            i64 d = p >= 0 ? dep[p] + 1 : 0;                                               \
            dep[i] = d;                                                                    \
            bad |= (i64)pos[s + i] != want + d;                                            \
        }                                                                                  \
        if (bad) return 1;                                                                 \
    }                                                                                      \
    return 0;                                                                              \
}
POSITIONS_BAD_PARENTS(positions_bad_parents_p32, i32)
POSITIONS_BAD_PARENTS(positions_bad_parents_p64, i64)

/* SA304: any ok row with a path entry k >= 1 whose node's token differs from the
   target's argmax at entry k - 1's node (ok: a valid walk, every entry in the row). */
i64 path_argmax_bad(i64 R, const u8 *ok, const i32 *path, const i64 *path_start, const i64 *path_len,
                    const i64 *start, const i32 *argmax, const i32 *tokens, const i64 *inv)
{
    for (i64 b = 0; b < R; b++) {
        i64 r = inv[b];
        if (!ok[r]) continue;
        i64 s = start[r], ps = path_start[r];
        int bad = 0;
        for (i64 k = ps + 1; k < ps + path_len[r]; k++)
            bad |= argmax[s + path[k - 1]] != tokens[s + path[k]];
        if (bad) return 1;
    }
    return 0;
}

/* SA304 and SA305 on a uniform-N batch of chains, in one pass over tok and arg (both
   rules read them). An ok row's path is 0 .. L - 1 (each entry the next node), so no path
   entry is read. SA304: any node 1 <= i < L with tok[b, i] != arg[b, i - 1]. SA305: the
   path's last node L - 1 has one child, node L: any ok row with L < N0 and tok[b, L] ==
   arg[b, L - 1], the column clamped to [1, N0 - 1] as numpy's twin does (index -1
   meaning the last, as numpy's). tok, arg [R, N0]. Returns bit 1 for SA304, 2 for SA305. */
static inline i64 path_chain_bad_n(i64 N, i64 R, const u8 *ok, const i64 *path_len, const i64 *inv,
                                   const i32 *tok, const i32 *arg)
{
    i64 found = 0;
    for (i64 b0 = 0; b0 < R; b0 += BLOCK) {
        i64 e = b0 + BLOCK < R ? b0 + BLOCK : R;
        int argmax_bad = 0, not_maximal = 0;
        for (i64 b = b0; b < e; b++) {
            i64 r = inv[b], L = path_len[r];
            i64 Lok = ok[r] ? L : 0;
            const i32 *t = tok + b * N, *a = arg + b * N;
            for (i64 i = 1; i < N; i++) argmax_bad |= (i < Lok) & (a[i - 1] != t[i]);
            i64 c = L > 1 ? L : 1;
            if (c > N - 1) c = N - 1;
            i64 cm = c - 1 < 0 ? c - 1 + N : c - 1;
            not_maximal |= ok[r] & (L < N) & (t[c] == a[cm]);
        }
        found |= (argmax_bad ? 1 : 0) | (not_maximal ? 2 : 0);
        if (found == 3) break;
    }
    return found;
}
i64 path_chain_bad(i64 R, i64 N0, const u8 *ok, const i64 *path_len, const i64 *inv,
                   const i32 *tok, const i32 *arg)
{
    BY_N0(path_chain_bad_n, R, ok, path_len, inv, tok, arg)
}

/* SA304 and SA305 on a uniform-N batch of known shapes, in one pass over each ok row's
   path and its [N0] blocks of tok and arg (both rules read them): SA304 as
   path_argmax_bad (a path entry k >= 1 whose node's token differs from the argmax at
   entry k - 1's node), SA305: the path's last node has a child c with tok[b, c] ==
   arg[b, last] (the bonus); children [U, N0, K] each node's children ascending, -1
   after the last; ids as in positions_bad_uniform. Block b is batch row b, so the
   row's start is b * N0. Returns bit 1 for SA304, 2 for SA305. */
i64 path_tree_bad(i64 R, i64 N0, i64 K, const u8 *ok, const i32 *path, const i64 *path_start,
                  const i64 *path_len, const i64 *inv, i64 n_ids, const i64 *ids,
                  const i64 *children, const i32 *tok, const i32 *arg)
{
    i64 found = 0;
    for (i64 b0 = 0; b0 < R; b0 += BLOCK) {
        i64 e = b0 + BLOCK < R ? b0 + BLOCK : R;
        int argmax_bad = 0, not_maximal = 0;
        for (i64 b = b0; b < e; b++) {
            i64 r = inv[b];
            if (!ok[r]) continue;
            const i32 *t = tok + b * N0, *a = arg + b * N0, *pa = path + path_start[r];
            i64 L = path_len[r];
            for (i64 k = 1; k < L; k++) argmax_bad |= a[pa[k - 1]] != t[pa[k]];
            i64 last = pa[L - 1];
            i32 bonus = a[last];
            const i64 *ch = children + ((n_ids == 0 ? 0 : ids[b]) * N0 + last) * K;
            for (i64 k = 0; k < K; k++) {
                i64 c = ch[k];
                not_maximal |= (c >= 0) & (t[c > 0 ? c : 0] == bonus);
            }
        }
        found |= (argmax_bad ? 1 : 0) | (not_maximal ? 2 : 0);
        if (found == 3) break;
    }
    return found;
}

/* SA305 on any batch: any ok row whose path's last node has a child (a later node whose
   safe parent is it) carrying the argmax at it. */
i64 path_not_maximal(i64 R, const u8 *ok, const i32 *path, const i64 *path_start, const i64 *path_len,
                     const i64 *start, const i64 *n, const i64 *parent_in_row, const i32 *tokens,
                     const i32 *argmax, const i64 *inv)
{
    for (i64 b = 0; b < R; b++) {
        i64 r = inv[b];
        if (!ok[r]) continue;
        i64 s = start[r];
        i64 last = path[path_start[r] + path_len[r] - 1];
        i32 bonus = argmax[s + last];
        int bad = 0;
        for (i64 i = last + 1; i < n[r]; i++)
            bad |= (parent_in_row[s + i] == last) & (tokens[s + i] == bonus);
        if (bad) return 1;
    }
    return 0;
}

/* SA102: any row with no node, more than budget + 1 nodes, or above MAX_NODES. */
i64 node_count_bad(i64 R, const i64 *n_raw, const i64 *n, const i64 *budget, const u8 *too_many)
{
    for (i64 r = 0; r < R; r++)
        if (n_raw[r] < 1 || n[r] > budget[r] + 1 || too_many[r]) return 1;
    return 0;
}

/* SA103: any row with nodes whose root's parent is not -1 (the frame's flag). */
i64 root_parent_bad(i64 R, const u8 *root_parent_bad, const i64 *n)
{
    for (i64 r = 0; r < R; r++)
        if (root_parent_bad[r] && n[r] > 0) return 1;
    return 0;
}

/* SA403: any row that follows its request's previous step (step = prev_step + 1) whose
   root token differs from that step's last committed token. */
i64 root_continuity_bad(i64 R, i64 T, const u8 *has_prev, const i64 *step, const i32 *prev_step,
                        const i32 *prev_last, const i64 *start, const i64 *n, const i32 *tokens,
                        const i64 *inv)
{
    if (T < 1) return 0;
    for (i64 b = 0; b < R; b++) {
        i64 r = inv[b];
        i64 g = start[r] < T - 1 ? start[r] : T - 1;
        if (has_prev[r] && step[r] == (i64)prev_step[r] + 1 && n[r] > 0 && tokens[g] != prev_last[r]) return 1;
    }
    return 0;
}

/* SA202 where every row's contract hash is the same `want` (a uniform batch of chains). */
i64 hash_differs(i64 R, const uint64_t *mask_hash, uint64_t want)
{
    for (i64 r = 0; r < R; r++)
        if (mask_hash[r] != want) return 1;
    return 0;
}

/* ---- per-row tests (sorted rows r, every array [R]; a block of rows between two exits) */
#define ANY_ROW(TEST)                                                                      \
    for (i64 r0 = 0; r0 < R; r0 += BLOCK) {                                                \
        i64 e = r0 + BLOCK < R ? r0 + BLOCK : R;                                           \
        int bad = 0;                                                                       \
        for (i64 r = r0; r < e; r++) bad |= (TEST);                                        \
        if (bad) return 1;                                                                 \
    }                                                                                      \
    return 0;

/* SA401: any step != (has_prev ? prev_step + 1 : 0), prev_step + 1 in prev_step's width
   (wrapping, as numpy's). */
i64 step_bad_p32(i64 R, const i64 *step, const u8 *has_prev, const i32 *prev_step)
{
    ANY_ROW(step[r] != (has_prev[r] ? (i64)(i32)((uint32_t)prev_step[r] + 1u) : 0))
}
i64 step_bad_p64(i64 R, const i64 *step, const u8 *has_prev, const i64 *prev_step)
{
    ANY_ROW(step[r] != (has_prev[r] ? (i64)((uint64_t)prev_step[r] + 1u) : 0))
}

/* SA301: with want = accepted_depth + 1 (wrapping): an unfinished row with commit_len !=
   want, or a finished one with commit_len > want. */
i64 commit_len_bad(i64 R, const i64 *accepted_depth, const i64 *commit_len, const u8 *finished)
{
    ANY_ROW(finished[r] ? commit_len[r] > (i64)((uint64_t)accepted_depth[r] + 1u)
                        : commit_len[r] != (i64)((uint64_t)accepted_depth[r] + 1u))
}

/* SA302: any row with path_len >= 1 and path_len - 1 != accepted_depth. */
i64 path_depth_bad(i64 R, const i64 *path_len, const i64 *accepted_depth)
{
    ANY_ROW((path_len[r] >= 1) & (path_len[r] - 1 != accepted_depth[r]))
}

/* SA308: any row whose first EOS in the commit (eos_at, -1: none) is before its last
   committed token: 0 <= eos_at < commit_n - 1. */
i64 eos_inside_commit(i64 R, const i64 *eos_at, const i64 *commit_n)
{
    ANY_ROW((eos_at[r] >= 0) & (eos_at[r] < commit_n[r] - 1))
}

/* SA105: any ok row whose most children of a node (kids) exceed topk; the _chain twin
   takes n instead, a chain's children_max being n > 1 as 0/1. */
i64 children_over_topk(i64 R, const u8 *ok, const i64 *kids, const i64 *topk)
{
    ANY_ROW(ok[r] & (kids[r] > topk[r]))
}
i64 children_over_topk_chain(i64 R, const u8 *ok, const i64 *n, const i64 *topk)
{
    ANY_ROW(ok[r] & ((i64)(n[r] > 1) > topk[r]))
}

/* SA311 (max_new_tokens M known): with out = out_before + commit_n (wrapping), any
   contiguous row with a valid path that finished without a cause (commit not ending at
   eos, out != M), went past M, or reached M unfinished. */
i64 token_limit_bad(i64 R, i64 M, i64 eos, const i64 *out_before, const i64 *commit_n,
                    const i64 *commit_last, const u8 *contiguous, const u8 *path_ok, const u8 *finished)
{
    ANY_ROW(contiguous[r] & path_ok[r] &
            ((finished[r] & (commit_last[r] != eos) & ((i64)((uint64_t)out_before[r] + (uint64_t)commit_n[r]) != M))
             | ((i64)((uint64_t)out_before[r] + (uint64_t)commit_n[r]) > M)
             | (!finished[r] & ((i64)((uint64_t)out_before[r] + (uint64_t)commit_n[r]) >= M))))
}

/* SA402: any row with a previous step, step = prev_step + 1 (wrapping in prev_step's
   width, as numpy adds) and seq_len != prev_seq_end. [R] each. */
i64 seq_len_bad_p32(i64 R, const i64 *step, const u8 *has_prev, const i32 *prev_step, const i64 *seq_len,
                    const i64 *prev_seq_end)
{
    ANY_ROW((has_prev[r] != 0) & (step[r] == (i64)(i32)((uint32_t)prev_step[r] + 1u))
            & (seq_len[r] != prev_seq_end[r]))
}
i64 seq_len_bad_p64(i64 R, const i64 *step, const u8 *has_prev, const i64 *prev_step, const i64 *seq_len,
                    const i64 *prev_seq_end)
{
    ANY_ROW((has_prev[r] != 0) & (step[r] == (i64)((uint64_t)prev_step[r] + 1u))
            & (seq_len[r] != prev_seq_end[r]))
}

/* SA307: any path_ok row whose commit differs from the path's tokens (mis_at >= 0), or
   an unfinished one whose commit is shorter than the path (commit_n < path_len). [R] each. */
i64 committed_tokens_bad(i64 R, const u8 *path_ok, const u8 *finished, const i64 *commit_n, const i64 *path_len,
                         const i64 *mis_at)
{
    ANY_ROW((path_ok[r] != 0) & ((mis_at[r] >= 0) | ((finished[r] == 0) & (commit_n[r] < path_len[r]))))
}
