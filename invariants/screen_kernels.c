/* The clean-batch screen (invariants/screen.py): one pass over a batch in its own order,
   each row tested against its request's carried state and folded into it, no sort.

   A row passes when every step rule of SA1xx-SA4xx would be silent on it: N nodes in every
   per-node list, 1 <= N <= budget + 1, parents a chain (i - 1) or, for a tree, each an
   earlier node with at most topk children each (a chain when topk is 1), positions
   seq_len + depth, the mask hash of its shape, the path from the root down matching
   the target's argmax and maximal, the commit the accepted drafts then the bonus (a
   prefix of it when finished), no token after an EOS and an EOS only on a finished
   step, the counters (accepted_depth = len(path) - 1, commit_len = len(commit), an
   unfinished step commits depth + 1), the token limit (finished exactly at EOS or at
   max_new_tokens), and the step, seq_len and root continuing the request's previous
   step, which must not have finished. The screen is stricter than the rules, never
   looser: a row it cannot vouch for stops it, and the batch is checked in full
   (StepFrame, the definition); tests/test_screen.py holds the two equal, and breaks each
   test here alone (but the guards that keep reads inside a row, and a request whose
   steps had a gap, which is refused only to keep this simple: SA311 skips it). A tree
   batch comes with its rows grouped by shape (equal parents), each shape's parents,
   depths, most children, child lists and mask hash (screen.py, once per shape): a tree
   row's own parents are not read again.

   Returns 0 when every row passed, with the batch folded into the carry exactly as
   StepFrame.finish_carry folds it and its run sums and depth histogram added; else 1 +
   the first row that did not pass, the carry then part-folded (the caller restores the
   rows it saved). Shapes: R rows, N nodes each; list values indexed by the Arrow
   offsets (int32); carry fields indexed by carry row (crow[code], code the request_id's
   dictionary code of the row). */
#include <stdint.h>
#include "kernels_mix.h"

typedef int64_t i64; typedef int32_t i32; typedef uint8_t u8; typedef uint64_t u64;

#define MAX_N 4096   /* MAX_NODES of the contract: the screen declines above */
#define MAX_BIN 4096

/* the arguments: the batch's columns, then the carry (invariants/frame_link.py's _FOLDED order) */
#define CARRY_ARGS i32 *first_seq_len, i32 *first_root, u8 *first_ok, u8 *seen, i32 *n_steps,        \
    i64 *sum_commit_len, i64 *sum_commit_n, i64 *sum_depth, i64 *sum_true_depth, u64 *hash,         \
    i64 *out_len, u8 *contiguous, u8 *finished_any, u8 *last_finished, i32 *last_step, i64 *seq_end, \
    i32 *last_tok

/* the row's per-node lists: N entries each, from the same offsets */
static inline int lists_bad(i64 r, i64 N, const i32 *o1, const i32 *o2, const i32 *o3, const i32 *o4)
{
    return o1[r + 1] - o1[r] != N || o2[r + 1] - o2[r] != N || o3[r + 1] - o3[r] != N || o4[r + 1] - o4[r] != N;
}

/* the commit against the path: entry k is the token of path[k + 1], the last the bonus
   (argmax at the path's last node); EOS only last and only finished; the token limit when
   known. Its length is settled before: 1 <= cn <= pl, cn = pl unless finished (the counters) */
static inline int commit_bad(const i32 *c, i64 cn, const i32 *path, i64 pl, const i32 *t, const i32 *a,
                             int fin, i64 eos, i64 max_new, i64 out_before)
{
    for (i64 k = 0; k < cn; k++) {
        i32 want = k + 1 < pl ? t[path[k + 1]] : a[path[pl - 1]];
        if (c[k] != want) return 1;
        if (c[k] == eos && (k != cn - 1 || !fin)) return 1;
    }
    if (max_new >= 0) {
        i64 out = out_before + cn;
        if (out > max_new) return 1;
        if (fin && c[cn - 1] != eos && out != max_new) return 1;
        if (!fin && out >= max_new) return 1;
    }
    return 0;
}

i64 screen_rows(i64 R, i64 N, i64 tree, i64 eos, i64 max_new, u64 chain_hash,
                const i32 *codes, const i64 *crow,
                const i32 *step, const i32 *seq_len, const i32 *budget, const i32 *topk,
                const i32 *depth, const i32 *clen, const u8 *fin, const u64 *mhash,
                const i32 *o_tok, const i32 *tok, const i32 *o_par, const i32 *par,
                const i32 *o_pos, const i32 *pos, const i32 *o_am, const i32 *am,
                const i32 *o_path, const i32 *path, const i32 *o_com, const i32 *com,
                const i64 *shape_id, const u64 *shape_hash, const i32 *shape_depth, const i32 *shape_kids,
                const i32 *shape_par, const i32 *child_off, const i32 *child_idx,
                CARRY_ARGS, u64 *sums, i64 *hist)
{
    if (N < 1 || N > MAX_N) return 1;
    u64 s_drafted = 0, s_acc = 0, s_accc = 0, s_com = 0, s_clen = 0, s_width = 0;
    for (i64 r = 0; r < R; r++) {
        if (lists_bad(r, N, o_tok, o_par, o_pos, o_am)) return r + 1;
        i64 s = crow[codes[r]];
        const i32 *t = tok + o_tok[r], *p = par + o_par[r], *q = pos + o_pos[r], *a = am + o_am[r];
        i32 st = step[r], sl = seq_len[r];
        int f = fin[r] != 0;
        /* continuity (SA401-404): the step after the carried one, unfinished before */
        if (seen[s]) {   /* (a request whose steps had a gap: not screened, SA311 does not apply there) */
            if (st != last_step[s] + 1 || sl != seq_end[s] || t[0] != last_tok[s] || finished_any[s]
                || !contiguous[s]) return r + 1;
        } else if (st != 0) return r + 1;
        /* structure (SA102-106), positions (SA201), the mask (SA202) */
        if (budget[r] < 0 || N > (i64)budget[r] + 1 || q[0] != sl) return r + 1;
        i64 u = tree ? shape_id[r] : 0;
        if (!tree) {
            if (p[0] != -1) return r + 1;
            if (topk[r] < (N > 1 ? 1 : 0)) return r + 1;   /* a chain's nodes have one child, its last none */
            int b = 0;   /* accumulated, not returned at once: the compiler vectorises it */
            for (i64 i = 1; i < N; i++) b |= (p[i] != (i32)(i - 1)) | (q[i] != sl + (i32)i);
            if (b) return r + 1;
            if (mhash[r] != chain_hash) return r + 1;
        } else {
            /* the row's parents are its shape's (rows grouped by equal parents, each shape
               a valid tree: screen.py): at most topk children per node (with topk 1 that
               makes the tree a chain: SA106), positions at each node's depth */
            const i32 *d = shape_depth + u * N;
            p = shape_par + u * N;                 /* the row's own (equal): read once per shape */
            if (shape_kids[u] > topk[r] || mhash[r] != shape_hash[u]) return r + 1;
            int b = 0;
            for (i64 i = 1; i < N; i++) b |= q[i] != sl + d[i];
            if (b) return r + 1;
        }
        /* the path (SA302-305) and the counters (SA301, SA306, SA310) */
        i64 ps = o_path[r], pl = o_path[r + 1] - ps, cs = o_com[r], cn = o_com[r + 1] - cs;
        const i32 *pa = path + ps;
        if (pl < 1 || pl > N || pa[0] != 0 || depth[r] != pl - 1 || clen[r] != cn || cn < 1) return r + 1;
        if (f ? cn > pl : cn != pl) return r + 1;   /* commit_len = depth + 1 unless finished */
        for (i64 k = 1; k < pl; k++) {
            i32 v = pa[k], w = pa[k - 1];
            if (v < 1 || v >= N || p[v] != w || t[v] != a[w]) return r + 1;
        }
        i32 last = pa[pl - 1], bonus = a[last];
        if (!tree) {
            if (last + 1 < N && t[last + 1] == bonus) return r + 1;
        } else {
            /* the last node's children, from its shape's child lists */
            const i32 *co = child_off + u * (N + 1), *ci = child_idx + u * N;
            for (i32 j = co[last]; j < co[last + 1]; j++)
                if (t[ci[j]] == bonus) return r + 1;
        }
        /* the commit (SA307-309, SA311) */
        const i32 *c = com + cs;
        if (commit_bad(c, cn, pa, pl, t, a, f, eos, max_new, out_len[s])) return r + 1;
        /* passed: fold into the carry (StepFrame.finish_carry) and the run sums (RunSums) */
        if (!seen[s]) { first_seq_len[s] = sl; first_root[s] = t[0]; first_ok[s] = 1; seen[s] = 1; }
        n_steps[s] += 1;
        sum_commit_len[s] += clen[r]; sum_commit_n[s] += cn; sum_depth[s] += depth[r]; sum_true_depth[s] += pl - 1;
        u64 h = 0;
        for (i64 k = 0; k < cn; k++) h += token_mix1(c[k], out_len[s] + k);
        hash[s] += h;
        out_len[s] += cn;
        finished_any[s] |= (u8)f; last_finished[s] = (u8)f;
        last_step[s] = st; seq_end[s] = (i64)sl + cn; last_tok[s] = c[cn - 1];
        s_drafted += (u64)(N - 1); s_acc += (u64)(pl - 1); s_accc += (u64)(i64)depth[r];
        s_com += (u64)cn; s_clen += (u64)(i64)clen[r]; s_width += (u64)(i64)budget[r];
        hist[pl - 1 < MAX_BIN ? pl - 1 : MAX_BIN] += 1;
    }
    /* RunSums' order (specaudit/audit/check/sums_kernels.py KEYS) */
    sums[0] += s_drafted; sums[1] += s_acc; sums[2] += s_accc; sums[3] += s_com; sums[4] += s_clen;
    sums[5] += s_width; sums[7] += (u64)R;
    return 0;
}
