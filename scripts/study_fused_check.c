#include <stdint.h>
typedef int64_t i64; typedef int32_t i32; typedef uint8_t u8;
/* A study for issue 35 (scripts/study_fused_check.py), not the checker: one pass over a
   uniform-N chain batch in batch order, each row linked to its request's carried state
   (slot s, no sort by request and step), the core per-row tests (continuity of step and
   seq_len, chain parents, positions, the accepted path, the commit against the drafted
   tokens and the bonus, the depth and commit_len counters) and the carry fold at once.
   Returns the rows that fail any test. Arrays are the Arrow buffers as read: int32. */
i64 fused_chain(i64 R, i64 N, const i32 *codes, const i64 *gidx, const i32 *step, const i32 *seq_len,
                const i32 *tok, const i32 *par, const i32 *pos, const i32 *am,
                const i32 *p_off, const i32 *path, const i32 *c_off, const i32 *commit,
                const i32 *depth, const i32 *clen,
                i32 *last_step, i64 *seq_end, u8 *seen, i64 *out_len, uint64_t *h)
{
    i64 bad = 0;
    for (i64 r = 0; r < R; r++) {
        i64 s = gidx[codes[r]];
        const i32 *t = tok + r * N, *p = par + r * N, *q = pos + r * N, *a = am + r * N;
        int b = 0;
        if (seen[s]) { b |= step[r] != last_step[s] + 1; b |= seq_len[r] != seq_end[s]; }
        else b |= step[r] != 0;
        for (i64 i = 0; i < N; i++) { b |= p[i] != (i32)(i - 1); b |= q[i] != seq_len[r] + i; }
        i64 ps = p_off[r], pl = p_off[r + 1] - ps, cs = c_off[r], cn = c_off[r + 1] - cs;
        b |= pl < 1 || pl > N;
        if (!b) {
            for (i64 k = 0; k < pl; k++) b |= path[ps + k] != k;
            b |= cn > pl || cn < 1 || depth[r] != pl - 1 || clen[r] != cn;
            if (!b) {
                for (i64 k = 0; k < cn; k++)
                    b |= commit[cs + k] != (k + 1 < pl ? t[path[ps + k + 1]] : a[path[ps + pl - 1]]);
            }
        }
        bad += b;
        uint64_t hh = 0;
        for (i64 k = 0; k < cn; k++) hh += (uint64_t)(commit[cs + k] + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(out_len[s] + k);
        h[s] += hh; out_len[s] += cn; seq_end[s] = seq_len[r] + cn; last_step[s] = step[r]; seen[s] = 1;
    }
    return bad;
}

/* The same for a uniform-N tree batch: the parents form a tree rooted at node 0 (each
   parent an earlier node), positions are seq_len + the node's depth, the path walks
   down the tree from the root with each accepted token the target's argmax at its
   parent (greedy) and stops where no child matches (maximal), and the commit is the path's
   tokens then the bonus. */
#define MAX_N 256
i64 fused_tree(i64 R, i64 N, const i32 *codes, const i64 *gidx, const i32 *step, const i32 *seq_len,
               const i32 *tok, const i32 *par, const i32 *pos, const i32 *am,
               const i32 *p_off, const i32 *path, const i32 *c_off, const i32 *commit,
               const i32 *depth, const i32 *clen,
               i32 *last_step, i64 *seq_end, u8 *seen, i64 *out_len, uint64_t *h)
{
    if (N < 1 || N > MAX_N) return R;
    i64 bad = 0;
    i32 d[MAX_N];
    for (i64 r = 0; r < R; r++) {
        i64 s = gidx[codes[r]];
        const i32 *t = tok + r * N, *p = par + r * N, *q = pos + r * N, *a = am + r * N;
        int b = 0;
        if (seen[s]) { b |= step[r] != last_step[s] + 1; b |= seq_len[r] != seq_end[s]; }
        else b |= step[r] != 0;
        b |= p[0] != -1 || q[0] != seq_len[r];
        d[0] = 0;
        for (i64 i = 1; i < N; i++) {
            i32 pi = p[i];
            if (pi < 0 || pi >= i) { b = 1; d[i] = 0; continue; }
            d[i] = d[pi] + 1;
            b |= q[i] != seq_len[r] + d[i];
        }
        i64 ps = p_off[r], pl = p_off[r + 1] - ps, cs = c_off[r], cn = c_off[r + 1] - cs;
        b |= pl < 1 || pl > N || cn > pl || cn < 1 || depth[r] != pl - 1 || clen[r] != cn;
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
            for (i64 k = 0; k < cn; k++)
                b |= commit[cs + k] != (k + 1 < pl ? t[path[ps + k + 1]] : a[last]);
        }
        bad += b;
        uint64_t hh = 0;
        for (i64 k = 0; k < cn; k++) hh += (uint64_t)(commit[cs + k] + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(out_len[s] + k);
        h[s] += hh; out_len[s] += cn; seq_end[s] = seq_len[r] + cn; last_step[s] = step[r]; seen[s] = 1;
    }
    return bad;
}
