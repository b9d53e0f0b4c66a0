#include <stdint.h>
typedef int64_t i64; typedef int32_t i32; typedef uint8_t u8;
/* A study for issue 35 (scripts/study_fused_check.py), not the checker: one pass over a
   uniform-N batch in batch order, each row linked to its request's carried state (slot s,
   no sort by request and step), the core per-row tests (continuity of step and seq_len,
   parents, positions, the accepted path, the commit against the drafted tokens and the
   bonus, the depth and commit_len counters) and the carry fold at once. Each returns the
   rows that fail any test. Arrays are the Arrow buffers as read: int32; per row, N nodes
   of tok / par / pos / am, the path and commit as list offsets and values. */

/* both kernels' arguments: the batch, then the carry (per slot) they read and fold into */
#define FUSED_ARGS i64 R, i64 N, const i32 *codes, const i64 *gidx, const i32 *step, const i32 *seq_len, \
    const i32 *tok, const i32 *par, const i32 *pos, const i32 *am, const i32 *p_off, const i32 *path,    \
    const i32 *c_off, const i32 *commit, const i32 *depth, const i32 *clen,                             \
    i32 *last_step, i64 *seq_end, u8 *seen, i64 *out_len, uint64_t *h

/* the row's step and seq_len continue its request's carried state (a first step is 0) */
static inline int link_bad(i64 s, i32 step, i32 seq_len, const i32 *last_step, const i64 *seq_end, const u8 *seen)
{
    return seen[s] ? (step != last_step[s] + 1 || seq_len != seq_end[s]) : step != 0;
}

/* the counters against the path and commit lengths (a commit may stop short: EOS, limit) */
static inline int counters_bad(i64 N, i64 pl, i64 cn, i32 depth, i32 clen)
{
    return pl < 1 || pl > N || cn > pl || cn < 1 || depth != pl - 1 || clen != cn;
}

/* the commit: the path's tokens after the root, then the bonus (the argmax at its last node) */
static inline int commit_bad(const i32 *commit, i64 cn, const i32 *path, i64 pl, const i32 *t, const i32 *a)
{
    int b = 0;
    for (i64 k = 0; k < cn; k++) b |= commit[k] != (k + 1 < pl ? t[path[k + 1]] : a[path[pl - 1]]);
    return b;
}

/* the row folded into its slot: an order-sensitive fingerprint of the commit, the lengths */
static inline void fold(i64 s, i32 step, i32 seq_len, const i32 *commit, i64 cn,
                        i32 *last_step, i64 *seq_end, u8 *seen, i64 *out_len, uint64_t *h)
{
    uint64_t hh = 0;
    for (i64 k = 0; k < cn; k++) hh += (uint64_t)(commit[k] + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(out_len[s] + k);
    h[s] += hh; out_len[s] += cn; seq_end[s] = seq_len + cn; last_step[s] = step; seen[s] = 1;
}

/* a chain: parents i - 1, positions seq_len + i, the path 0, 1, 2, ... */
i64 fused_chain(FUSED_ARGS)
{
    i64 bad = 0;
    for (i64 r = 0; r < R; r++) {
        i64 s = gidx[codes[r]];
        const i32 *t = tok + r * N, *p = par + r * N, *q = pos + r * N, *a = am + r * N;
        int b = link_bad(s, step[r], seq_len[r], last_step, seq_end, seen);
        for (i64 i = 0; i < N; i++) { b |= p[i] != (i32)(i - 1); b |= q[i] != seq_len[r] + i; }
        i64 ps = p_off[r], pl = p_off[r + 1] - ps, cs = c_off[r], cn = c_off[r + 1] - cs;
        b |= counters_bad(N, pl, cn, depth[r], clen[r]);
        if (!b) {
            for (i64 k = 0; k < pl; k++) b |= path[ps + k] != k;
            if (!b) b |= commit_bad(commit + cs, cn, path + ps, pl, t, a);
        }
        bad += b;
        fold(s, step[r], seq_len[r], commit + cs, cn, last_step, seq_end, seen, out_len, h);
    }
    return bad;
}

/* a tree: each parent an earlier node (the root's -1), positions seq_len + the node's
   depth, the path down the tree from the root with each accepted token the target's
   argmax at its parent (greedy), ending where no child matches (maximal) */
#define MAX_N 256
i64 fused_tree(FUSED_ARGS)
{
    if (N < 1 || N > MAX_N) return R;
    i64 bad = 0;
    i32 d[MAX_N];
    for (i64 r = 0; r < R; r++) {
        i64 s = gidx[codes[r]];
        const i32 *t = tok + r * N, *p = par + r * N, *q = pos + r * N, *a = am + r * N;
        int b = link_bad(s, step[r], seq_len[r], last_step, seq_end, seen);
        b |= p[0] != -1 || q[0] != seq_len[r];
        d[0] = 0;
        for (i64 i = 1; i < N; i++) {
            i32 pi = p[i];
            if (pi < 0 || pi >= i) { b = 1; d[i] = 0; continue; }
            d[i] = d[pi] + 1;
            b |= q[i] != seq_len[r] + d[i];
        }
        i64 ps = p_off[r], pl = p_off[r + 1] - ps, cs = c_off[r], cn = c_off[r + 1] - cs;
        b |= counters_bad(N, pl, cn, depth[r], clen[r]);
        if (!b) {
            b |= path[ps] != 0;
            for (i64 k = 1; k < pl && !b; k++) {
                i32 v = path[ps + k], u = path[ps + k - 1];
                b |= v < 1 || v >= N || p[v] != u || t[v] != a[u];
            }
        }
        if (!b) {
            i32 last = path[ps + pl - 1];
            for (i64 i = 1; i < N; i++) b |= p[i] == last && t[i] == a[last];   /* a matching child left */
            b |= commit_bad(commit + cs, cn, path + ps, pl, t, a);
        }
        bad += b;
        fold(s, step[r], seq_len[r], commit + cs, cn, last_step, seq_end, seen, out_len, h);
    }
    return bad;
}
