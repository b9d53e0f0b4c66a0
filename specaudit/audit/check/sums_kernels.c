/* RunSums' per-batch sums in one pass (built by invariants/compiled.py, wrapped by
   sums_kernels.py; core.RunSums.per_row and depth_bins are the definition, summed with
   numpy's int64 sum: wrapping, as here in uint64).

   R rows (the frame's sorted rows, any order: only sums). */
#include <stdint.h>

typedef int64_t i64;
typedef uint64_t u64;
typedef uint8_t u8;

#define MAX_BIN 4096   /* depth_bins clips the true depth to [0, MAX_BIN] */

/* sums [8]: drafted (sum max(n - 1, 0)), accepted (max(true_depth, 0)), accepted_counter
   (accepted_depth), committed (commit_n), commit_len_sum (commit_len), width_sum
   (max(budget, 0)), refused (!ok), steps (R); hist [MAX_BIN + 1] zeroed by the caller:
   the count of each clip(true_depth, 0, MAX_BIN). Returns the highest bin used (-1:
   no row), so hist[: returned + 1] is np.bincount's answer. */
i64 run_sums(i64 R, const i64 *n, const i64 *true_depth, const i64 *accepted_depth, const i64 *commit_n,
             const i64 *commit_len, const i64 *budget, const u8 *ok, u64 *sums, i64 *hist)
{
    u64 drafted = 0, accepted = 0, counter = 0, committed = 0, clen = 0, width = 0, refused = 0;
    for (i64 r = 0; r < R; r++) {
        i64 d = n[r] - 1, t = true_depth[r], w = budget[r];
        drafted += (u64)(d > 0 ? d : 0);
        accepted += (u64)(t > 0 ? t : 0);
        counter += (u64)accepted_depth[r];
        committed += (u64)commit_n[r];
        clen += (u64)commit_len[r];
        width += (u64)(w > 0 ? w : 0);
        refused += (u64)!ok[r];
    }
    i64 top = -1;
    for (i64 r = 0; r < R; r++) {
        i64 t = true_depth[r];
        i64 bin = t < 0 ? 0 : (t > MAX_BIN ? MAX_BIN : t);
        hist[bin]++;
        top = bin > top ? bin : top;
    }
    sums[0] = drafted; sums[1] = accepted; sums[2] = counter; sums[3] = committed;
    sums[4] = clen; sums[5] = width; sums[6] = refused; sums[7] = (u64)R;
    return top;
}
