-- Acceptance rate by depth, per config
--
-- What: for each config and depth d >= 1, the share of verify steps whose accepted path
-- reaches depth d (reach_rate: the per-position acceptance rate engines report) and the
-- share of steps reaching depth d-1 that go on to d (conditional_rate).
-- Depth comes from the evidence, len(accepted_path) - 1, not the engine's counter.
-- Why: the sum over d of reach_rate equals the mean accepted depth (shown per config as
-- mean_accepted_depth), and mean commit length = 1 + that on unfinished steps. A counter
-- that disagrees with this table is the bug; a dip at one depth points at the drafter's
-- position (or a position/mask bug at that depth).
-- Example: specaudit query traces/ acceptance_by_depth
-- Columns: config, depth, steps, steps_reaching, reach_rate, conditional_rate, mean_accepted_depth
WITH per_run AS (
    -- rollup_hist: step counts per (run, len(committed_tokens), len(accepted_path) - 1)
    SELECT run_id, depth AS d, sum(n) AS n
    FROM rollup_hist
    GROUP BY ALL
),
per_cfg AS (
    SELECT coalesce(r.config, p.run_id) AS config, p.d, sum(p.n)::BIGINT AS n
    FROM per_run AS p LEFT JOIN runs AS r USING (run_id)
    WHERE p.d >= 0
    GROUP BY ALL
),
depths AS (
    SELECT config, unnest(range(1, max(d) + 1)) AS depth, sum(n) AS steps,
           sum(n * d) / sum(n) AS mean_accepted_depth
    FROM per_cfg
    GROUP BY config
)
SELECT
    dp.config,
    dp.depth::INTEGER AS depth,
    any_value(dp.steps)::BIGINT AS steps,
    coalesce(sum(c.n) FILTER (WHERE c.d >= dp.depth), 0)::BIGINT AS steps_reaching,
    coalesce(sum(c.n) FILTER (WHERE c.d >= dp.depth), 0) / any_value(dp.steps) AS reach_rate,
    coalesce(sum(c.n) FILTER (WHERE c.d >= dp.depth), 0)
        / sum(c.n) FILTER (WHERE c.d >= dp.depth - 1) AS conditional_rate,
    any_value(dp.mean_accepted_depth) AS mean_accepted_depth
FROM depths AS dp
JOIN per_cfg AS c ON c.config = dp.config AND c.d >= dp.depth - 1
GROUP BY dp.config, dp.depth
ORDER BY dp.config, dp.depth
