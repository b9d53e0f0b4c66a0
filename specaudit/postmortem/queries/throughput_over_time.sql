-- Throughput and commit length over time, per run
--
-- What: each run's wall time cut into equal buckets (from its first step's start to its
-- last step's end); per bucket, the steps that started in it, the tokens they committed,
-- tokens per second (committed tokens / bucket width, all requests together) and the mean
-- commit length and accepted depth, all from the raw tensors (len(committed_tokens),
-- len(accepted_path) - 1); beside them the engine's counters' means (reported_*).
-- Why: an incident has a time. Acceptance that drops after a deploy, a cache that fills, a
-- CUDA-graph path that kicks in at some batch size: all show as a step in these lines
-- while the run's mean looks fine.
-- param buckets: time buckets per run (default 60)
-- Example: specaudit query traces/ throughput_over_time --param buckets=20
-- Columns: config, run_id, bucket, t_rel_s, bucket_s, steps, committed_tokens, tokens_per_s,
--          mean_commit_len, mean_accepted_depth, reported_mean_commit_len,
--          reported_mean_accepted_depth
WITH nb AS (
    SELECT greatest(coalesce(getvariable('buckets'), 60)::INTEGER, 1) AS buckets
),
bounds AS (
    -- rollup_request: t0 = min(t_start), t1 = max(t_start + step_s) per request
    SELECT run_id, min(t0) AS t0,
           greatest(max(t1) - min(t0), 1e-9) AS span
    FROM rollup_request
    GROUP BY run_id
),
b AS (
    -- rollup_time: the steps that started at each t_start (a batched forward's rows share it)
    SELECT
        s.run_id,
        least(floor((s.t_start - bd.t0) / bd.span * nb.buckets), nb.buckets - 1)::INTEGER AS bucket,
        sum(s.n) AS steps,
        sum(s.committed) AS committed,
        sum(s.depth_sum) AS depth_sum,
        sum(s.rep_commit) AS reported_committed,
        sum(s.rep_depth) AS reported_depth_sum
    FROM rollup_time AS s JOIN bounds AS bd USING (run_id), nb
    GROUP BY ALL
)
SELECT
    coalesce(r.config, b.run_id) AS config,
    b.run_id,
    b.bucket,
    b.bucket * bd.span / nb.buckets AS t_rel_s,
    bd.span / nb.buckets AS bucket_s,
    b.steps::BIGINT AS steps,
    b.committed::BIGINT AS committed_tokens,
    b.committed / (bd.span / nb.buckets) AS tokens_per_s,
    b.committed / b.steps AS mean_commit_len,
    b.depth_sum / b.steps AS mean_accepted_depth,
    b.reported_committed / b.steps AS reported_mean_commit_len,
    b.reported_depth_sum / b.steps AS reported_mean_accepted_depth
FROM b JOIN bounds AS bd USING (run_id) LEFT JOIN runs AS r USING (run_id), nb
ORDER BY config, b.run_id, b.bucket
