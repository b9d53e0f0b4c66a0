-- Per-request acceptance spread, per config
--
-- What: each request's own mean commit length and mean accepted depth (from the raw
-- tensors: len(committed_tokens), len(accepted_path) - 1), summarised per
-- config: requests, the pooled mean over steps against the mean of per-request means,
-- and the spread of per-request means (min, p10, median, p90, max, standard deviation).
-- Why: a mean hides a bimodal workload (code vs prose prompts); a pooled mean and a mean of
-- per-request means differ when long requests accept differently (the "pooled vs
-- per-request" bug class: the manifest must say which one an engine reports).
-- Example: specaudit query traces/ request_acceptance_spread
-- Columns: config, requests, steps, pooled_mean_commit_len, per_request_mean_commit_len,
--          min_commit_len, p10_commit_len, median_commit_len, p90_commit_len, max_commit_len,
--          stddev_commit_len, pooled_mean_accepted_depth, per_request_mean_accepted_depth,
--          reported_pooled_mean_commit_len
WITH per_req AS (
    -- rollup_request: one row per (request, file); a request's mean is its sum over its steps
    SELECT
        run_id,
        request_id,
        sum(n) AS steps,
        sum(committed) AS committed,
        sum(depth_sum) AS depth_sum,
        sum(rep_commit) AS reported_committed,
        sum(committed) / sum(n) AS mean_commit_len,
        sum(depth_sum) / sum(n) AS mean_accepted_depth
    FROM rollup_request
    GROUP BY ALL
),
agg AS (
    SELECT
        coalesce(r.config, q.run_id) AS config,
        count(*)::BIGINT AS requests,
        sum(q.steps)::BIGINT AS steps,
        sum(q.committed) / sum(q.steps) AS pooled_mean_commit_len,
        avg(q.mean_commit_len) AS per_request_mean_commit_len,
        min(q.mean_commit_len) AS min_commit_len,
        -- one sort for the three quantiles (three quantile_cont calls sorted three times)
        quantile_cont(q.mean_commit_len, [0.1, 0.5, 0.9]) AS qs,
        max(q.mean_commit_len) AS max_commit_len,
        stddev_samp(q.mean_commit_len) AS stddev_commit_len,
        sum(q.depth_sum) / sum(q.steps) AS pooled_mean_accepted_depth,
        avg(q.mean_accepted_depth) AS per_request_mean_accepted_depth,
        sum(q.reported_committed) / sum(q.steps) AS reported_pooled_mean_commit_len
    FROM per_req AS q LEFT JOIN runs AS r USING (run_id)
    GROUP BY ALL
)
SELECT config, requests, steps, pooled_mean_commit_len, per_request_mean_commit_len, min_commit_len,
       qs[1] AS p10_commit_len, qs[2] AS median_commit_len, qs[3] AS p90_commit_len,
       max_commit_len, stddev_commit_len, pooled_mean_accepted_depth, per_request_mean_accepted_depth,
       reported_pooled_mean_commit_len
FROM agg
ORDER BY config
