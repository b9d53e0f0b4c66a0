-- Draft / verify / other latency breakdown, per config
--
-- What: per config, the mean wall time of a step split into the drafter's forward
-- (draft_s), the target's verify forward (verify_s) and everything else (other_s =
-- step_s - draft_s - verify_s: sampling, bookkeeping, tracing, the host), with shares
-- and tokens committed (len(committed_tokens), not the counter) per second of step time.
-- Why: speculative decoding pays off only when drafting is cheap next to verifying; a
-- large other_s is overhead no acceptance rate can win back. Times are per step row, i.e.
-- per batched forward as seen by one request (rows of one forward share its times).
-- Example: specaudit query traces/ latency_breakdown
-- Columns: config, steps, mean_step_s, mean_draft_s, mean_verify_s, mean_other_s,
--          draft_share, verify_share, other_share, tokens_per_step_s
WITH per_run AS (
    -- rollup_request: per request sums; committed is sum(len(committed_tokens))
    SELECT run_id, sum(n) AS n, sum(step_s) AS step_s, sum(draft_s) AS draft_s,
           sum(verify_s) AS verify_s, sum(committed) AS committed
    FROM rollup_request
    GROUP BY run_id
)
SELECT
    coalesce(r.config, p.run_id) AS config,
    sum(p.n)::BIGINT AS steps,
    sum(p.step_s) / sum(p.n) AS mean_step_s,
    sum(p.draft_s) / sum(p.n) AS mean_draft_s,
    sum(p.verify_s) / sum(p.n) AS mean_verify_s,
    (sum(p.step_s) - sum(p.draft_s) - sum(p.verify_s)) / sum(p.n) AS mean_other_s,
    sum(p.draft_s) / nullif(sum(p.step_s), 0) AS draft_share,
    sum(p.verify_s) / nullif(sum(p.step_s), 0) AS verify_share,
    (sum(p.step_s) - sum(p.draft_s) - sum(p.verify_s)) / nullif(sum(p.step_s), 0) AS other_share,
    sum(p.committed) / nullif(sum(p.step_s), 0) AS tokens_per_step_s
FROM per_run AS p LEFT JOIN runs AS r USING (run_id)
GROUP BY ALL
ORDER BY config
