/* StepFrame's core in one pass per stage (built by invariants/compiled.py, wrapped by
   frame_kernels.py; the numpy of invariants/frame.py and frame_link.py is the
   definition, and tests/test_compiled_frame.py holds every array here equal to it).

   Shapes: R sorted rows (inv [R]: the sorted row of each batch row); T flat nodes
   (node i of sorted row r is flat start[r] + i); P path and C commit entries, flat,
   path_start / commit_start per sorted row; G request groups (runs of sorted rows of
   one request starting at gstart [G]), cr [G] their carry rows. Booleans are numpy's
   (one byte, 0 or 1). The list values (tokens, argmax, parents, path, commit) come as
   V: int32 as the contract writes them, or int64 (the wrapper widens any other case),
   one function per width.

     path_commit: path_struct_bad, last_node, bonus (the target's argmax at the path's
         last node), commit_mismatch_at, commit_eos_at, commit_last
     link_rows: has_prev, prev_step, prev_seq_end, prev_last, prev_finished,
         out_before, contiguous (StepFrame._link_previous)
     fold_carry: the batch folded into the carry (StepFrame.finish_carry) */
#include <stdint.h>
#include "kernels_mix.h"

typedef int64_t i64;
typedef int32_t i32;
typedef uint8_t u8;

/* rows visited in batch order (the flat arrays' own: sequential reads). The flat per-entry
   arrays (path_k, path_glob, expected_commit, commit_k) are left to numpy, built on first
   use: no rule reads them while the kernels find nothing (a clean batch), and writing them
   was a third of this pass */
#define PATH_COMMIT(NAME, V)                                                                \
void NAME(i64 R, const i64 *inv, const i64 *start, const i64 *n, i64 T, const V *tokens,    \
          const V *argmax, const V *parent_in_row, const V *path, const i64 *path_start,      \
          const i64 *path_len, const V *commit, const i64 *commit_start, const i64 *commit_n, \
          i64 eos_id, u8 *psb, i64 *last_node, i64 *bonus, i64 *mis_at, i64 *eos_at, i64 *c_last) \
{                                                                                           \
    for (i64 b = 0; b < R; b++) {                                                           \
        i64 r = inv[b], s = start[r], nr = n[r], ps = path_start[r], pl = path_len[r];      \
        /* the path: starts at node 0, stays in the row's tree, each entry a child of the   \
           one before (by the safe parents); an empty path is bad too */                    \
        int bad = pl < 1;                                                                   \
        for (i64 k = 0; k < pl; k++) {                                                      \
            i64 node = path[ps + k];                                                        \
            if (node < 0 || node >= nr) bad = 1;                                            \
            else if (k == 0) { if (node != 0) bad = 1; }                                    \
            else if ((i64)parent_in_row[s + node] != (i64)path[ps + k - 1]) bad = 1;        \
        }                                                                                   \
        psb[r] = (u8)bad;                                                                   \
        /* the path's last node, global (flat 0 for an entry out of range, the row's start  \
           for an empty path), at most T - 1 */                                             \
        i64 ln = s;                                                                         \
        if (pl > 0) {                                                                       \
            i64 node = path[ps + pl - 1];                                                   \
            ln = (0 <= node && node < nr) ? s + node : 0;                                   \
        }                                                                                   \
        i64 top = T - 1 > 0 ? T - 1 : 0;                                                    \
        if (ln > top) ln = top;                                                             \
        last_node[r] = ln;                                                                  \
        i64 bn = T > 0 ? (i64)argmax[ln] : -1;                                              \
        bonus[r] = bn;                                                                      \
        /* the commit against the expected one (the token of each next path entry, the      \
           bonus last), its first EOS and its last token */                                 \
        i64 cs = commit_start[r], cn = commit_n[r], mis = -1, eat = -1, cl = -1;            \
        for (i64 k = 0; k < cn; k++) {                                                      \
            i64 t = commit[cs + k];                                                         \
            if (mis < 0) {                                                                  \
                if (k >= pl) mis = k;                                                       \
                else {                                                                      \
                    i64 e = bn;                                                             \
                    if (k < pl - 1) {                                                       \
                        i64 node = path[ps + k + 1];                                        \
                        e = T > 0 ? (i64)tokens[(0 <= node && node < nr) ? s + node : 0] : -1; \
                    }                                                                       \
                    if (t != e) mis = k;                                                    \
                }                                                                           \
            }                                                                               \
            if (eat < 0 && t == eos_id) eat = k;                                            \
            cl = t;                                                                         \
        }                                                                                   \
        mis_at[r] = mis; eos_at[r] = eat; c_last[r] = cl;                                   \
    }                                                                                       \
}
PATH_COMMIT(path_commit_v32, i32)
PATH_COMMIT(path_commit_v64, i64)

/* a row's previous step is the sorted row before it, or the carried one (c_*, rows cr)
   at its group's first row */
void link_rows(i64 R, i64 G, const i64 *gstart, const i64 *cr, const i64 *step, const i64 *seq_len,
               const i64 *commit_n, const i64 *commit_last, const u8 *finished,
               const u8 *c_seen, const i32 *c_last_step, const i64 *c_seq_end, const i32 *c_last_tok,
               const u8 *c_finished, const i64 *c_out_len, const u8 *c_contiguous,
               u8 *has_prev, i32 *prev_step, i64 *prev_seq_end, i32 *prev_last, u8 *prev_finished,
               i64 *out_before, u8 *contiguous)
{
    for (i64 g = 0; g < G; g++) {
        i64 r0 = gstart[g], r1 = g + 1 < G ? gstart[g + 1] : R, c = cr[g];
        int fin = c_finished[c] != 0, run_ok = c_contiguous[c] != 0;
        i64 out = c_out_len[c];
        for (i64 r = r0; r < r1; r++) {
            if (r == r0) {
                has_prev[r] = c_seen[c] != 0;
                prev_step[r] = c_last_step[c];
                prev_seq_end[r] = c_seq_end[c];
                prev_last[r] = c_last_tok[c];
            } else {
                has_prev[r] = 1;
                prev_step[r] = (i32)step[r - 1];
                prev_seq_end[r] = seq_len[r - 1] + commit_n[r - 1];
                prev_last[r] = (i32)commit_last[r - 1];
            }
            prev_finished[r] = (u8)fin;
            fin = fin || finished[r];
            out_before[r] = out;
            out += commit_n[r];
            /* prev_step + 1 in prev_step's int32 (the carry's last_step), as numpy adds */
            i64 want = has_prev[r] ? (i64)(i32)((i64)prev_step[r] + 1) : 0;
            run_ok = run_ok && step[r] == want;
            contiguous[r] = (u8)run_ok;
        }
    }
}

/* each group folded into its carry row */
#define FOLD_CARRY(NAME, V)                                                                  \
void NAME(i64 R, i64 G, const i64 *gstart, const i64 *cr, const i64 *seq_len, const V *tokens, \
          const i64 *start, const i64 *n, const u8 *ok, const i64 *commit_len, const i64 *commit_n, \
          const i64 *accepted_depth, const i64 *path_len, const V *commit, const i64 *commit_start, \
          const i64 *out_before, const u8 *contiguous, const u8 *finished, const i64 *step,   \
          const i64 *commit_last,                                                            \
          i32 *c_first_seq_len, i32 *c_first_root, u8 *c_first_ok, u8 *c_seen, i32 *c_n_steps, \
          i64 *c_sum_commit_len, i64 *c_sum_commit_n, i64 *c_sum_depth, i64 *c_sum_true_depth, \
          uint64_t *c_hash, i64 *c_out_len, u8 *c_contiguous, u8 *c_finished, u8 *c_last_finished, \
          i32 *c_last_step, i64 *c_seq_end, i32 *c_last_tok)                                 \
{                                                                                            \
    for (i64 g = 0; g < G; g++) {                                                            \
        i64 r0 = gstart[g], r1 = g + 1 < G ? gstart[g + 1] : R, last = r1 - 1, c = cr[g];    \
        if (!c_seen[c]) {                                                                    \
            c_first_seq_len[c] = (i32)seq_len[r0];                                           \
            c_first_root[c] = n[r0] > 0 ? (i32)tokens[start[r0]] : -1;                       \
            c_first_ok[c] = ok[r0];                                                          \
        }                                                                                    \
        c_seen[c] = 1;                                                                       \
        c_n_steps[c] = (i32)((i64)c_n_steps[c] + (r1 - r0));                                 \
        i64 scl = 0, scn = 0, sd = 0, std_ = 0;                                              \
        uint64_t h = 0;                                                                      \
        int fin = 0;                                                                         \
        for (i64 r = r0; r < r1; r++) {                                                      \
            scl += commit_len[r];                                                            \
            scn += commit_n[r];                                                              \
            sd += accepted_depth[r];                                                         \
            std_ += path_len[r] - 1;                                                         \
            fin = fin || finished[r];                                                        \
            /* the order-sensitive fingerprint of the commits at their output positions */   \
            i64 cs = commit_start[r];                                                        \
            for (i64 k = 0; k < commit_n[r]; k++)                                            \
                h += token_mix1((i64)commit[cs + k], out_before[r] + k);                     \
        }                                                                                    \
        c_sum_commit_len[c] += scl;                                                          \
        c_sum_commit_n[c] += scn;                                                            \
        c_sum_depth[c] += sd;                                                                \
        c_sum_true_depth[c] += std_;                                                         \
        c_hash[c] += h;                                                                      \
        c_out_len[c] += scn;                                                                 \
        c_contiguous[c] = contiguous[last];                                                  \
        c_finished[c] = (u8)(c_finished[c] || fin);                                          \
        c_last_finished[c] = finished[last];                                                 \
        c_last_step[c] = (i32)step[last];                                                    \
        c_seq_end[c] = seq_len[last] + commit_n[last];                                       \
        c_last_tok[c] = (i32)commit_last[last];                                              \
    }                                                                                        \
}
FOLD_CARRY(fold_carry_v32, i32)
FOLD_CARRY(fold_carry_v64, i64)
