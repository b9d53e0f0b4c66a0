-- Commit-length histogram, per config
--
-- What: how many verify steps committed 1, 2, ... tokens, per config, counted from the
-- tokens actually committed (len(committed_tokens)), with the share of the config's steps,
-- how many of them finished the request, and, beside it, the engine's own counter: the
-- mean reported commit_len of those steps and how many of them it disagrees with.
-- Why: the distribution behind "mean commit length"; a spike at 1 is a drafter that never
-- lands, mass above budget + 1 is impossible, and counter_disagrees > 0 means the counter
-- under audit tells another story than the committed tokens (specaudit check says which).
-- Example: specaudit query traces/ commit_length_histogram --output-format csv
-- Columns: config, commit_len, steps, share, finished_steps, reported_mean_commit_len,
--          counter_disagrees
WITH per_run AS (
    -- rollup_hist: commit_len is len(committed_tokens); rep_commit sums the counter
    SELECT
        run_id,
        commit_len,
        sum(n) AS n,
        sum(n_finished) AS n_finished,
        sum(rep_commit) AS reported_sum,
        sum(n_disagree) AS n_disagree
    FROM rollup_hist
    GROUP BY ALL
),
per_cfg AS (
    SELECT
        coalesce(r.config, p.run_id) AS config,
        p.commit_len,
        sum(p.n) AS n,
        sum(p.n_finished) AS n_finished,
        sum(p.reported_sum) AS reported_sum,
        sum(p.n_disagree) AS n_disagree
    FROM per_run AS p LEFT JOIN runs AS r USING (run_id)
    GROUP BY ALL
)
SELECT
    config,
    commit_len,
    n::BIGINT AS steps,
    n / sum(n) OVER (PARTITION BY config) AS share,
    n_finished::BIGINT AS finished_steps,
    reported_sum / n AS reported_mean_commit_len,
    n_disagree::BIGINT AS counter_disagrees
FROM per_cfg
ORDER BY config, commit_len
