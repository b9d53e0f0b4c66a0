-- Acceptance against draft log-prob (drafter calibration), per config
--
-- What: every drafted node whose parent is on the accepted path ("reached": verification
-- looked at it), binned by its draft probability exp(draft_logprob); per bin, how many were
-- reached, how many accepted, the acceptance rate and the mean draft probability.
-- Why: a calibrated drafter's accept_rate tracks mean_draft_p (the diagonal). A drafter
-- above the diagonal is under-confident, below it over-confident; a flat line means its
-- confidence carries no information (wrong drafter weights, or a verify-side bug that
-- rejects good drafts: compare with acceptance_by_depth and with a chain run).
-- Rows with topk 1 (chains) use parents[i] = i - 1 and an accepted path that is a
-- prefix, as the contract requires (specaudit check enforces both); every other row
-- tests each node's parent against its accepted path. Rows without draft_logprob are skipped.
-- param bins: number of equal-width draft-probability bins (default 10)
-- Example: specaudit query traces/ acceptance_vs_draft_logprob --param bins=20
-- Columns: config, bin, p_lo, p_hi, reached, accepted, accept_rate, mean_draft_p
WITH nb AS (
    -- reached nodes are counted by rollup_calib (trace/rollup.py: the writers' rollups for
    -- the bins they store, else the same SQL over the raw rows)
    SELECT coalesce(getvariable('bins'), 10)::INTEGER AS bins
),
binned AS (
    SELECT run_id, bin, n, accepted AS a, p_sum AS p FROM rollup_calib, nb WHERE rollup_calib.bins = nb.bins
)
SELECT
    coalesce(r.config, b.run_id) AS config,
    b.bin,
    b.bin / nb.bins AS p_lo,
    (b.bin + 1) / nb.bins AS p_hi,
    sum(b.n)::BIGINT AS reached,
    sum(b.a)::BIGINT AS accepted,
    sum(b.a) / sum(b.n) AS accept_rate,
    sum(b.p) / sum(b.n) AS mean_draft_p
FROM binned AS b LEFT JOIN runs AS r USING (run_id), nb
GROUP BY coalesce(r.config, b.run_id), b.bin, nb.bins
ORDER BY config, bin
