-- Throughput and commit length over time, per run
--
-- What: each run's wall time cut into equal buckets of whole 0.5 s cells (the rollups' time
-- grain, rollup_time.grain_s): cells from the one holding the run's first step start to the
-- one holding its last, at most `buckets` buckets, each a whole number of cells wide (a run
-- shorter than `buckets` cells gets one bucket per cell). Per bucket, the steps that started
-- in it, the tokens they committed, tokens per second (committed tokens / bucket width, all
-- requests together) and the mean commit length and accepted depth, all from the raw tensors
-- (len(committed_tokens), len(accepted_path) - 1); beside them the engine's counters' means
-- (reported_*). t_rel_s counts from the start of the first cell (at most 0.5 s before the
-- run's first step). Steps without a finite t_start form a bucket of their own (NULL).
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
    -- rollup_time: one row per (run, file, cell); cell = floor(t_start / grain_s).
    -- m cells per bucket, the fewest that fit the run's cells into `buckets` buckets
    SELECT run_id, min(cell) AS c0, (max(cell) - min(cell)) // nb.buckets + 1 AS m,
           any_value(grain_s) AS g
    FROM rollup_time, nb
    WHERE cell IS NOT NULL
    GROUP BY run_id, nb.buckets
),
b AS (
    -- integer bucket of each cell: exact, every cell in exactly one bucket
    SELECT
        s.run_id,
        ((s.cell - bd.c0) // bd.m)::INTEGER AS bucket,
        sum(s.n) AS steps,
        sum(s.committed) AS committed,
        sum(s.depth_sum) AS depth_sum,
        sum(s.rep_commit) AS reported_committed,
        sum(s.rep_depth) AS reported_depth_sum
    FROM rollup_time AS s LEFT JOIN bounds AS bd USING (run_id)
    GROUP BY ALL
)
SELECT
    coalesce(r.config, b.run_id) AS config,
    b.run_id,
    b.bucket,
    b.bucket * bd.m * bd.g AS t_rel_s,
    bd.m * bd.g AS bucket_s,
    b.steps::BIGINT AS steps,
    b.committed::BIGINT AS committed_tokens,
    b.committed / (bd.m * bd.g) AS tokens_per_s,
    b.committed / b.steps AS mean_commit_len,
    b.depth_sum / b.steps AS mean_accepted_depth,
    b.reported_committed / b.steps AS reported_mean_commit_len,
    b.reported_depth_sum / b.steps AS reported_mean_accepted_depth
FROM b LEFT JOIN bounds AS bd USING (run_id) LEFT JOIN runs AS r USING (run_id)
ORDER BY config, b.run_id, b.bucket
