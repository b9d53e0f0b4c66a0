-- Commit-length histogram, per config
--
-- What: how many verify steps committed 1, 2, ... tokens (the engine's commit_len), per
-- config, with the share of the config's steps, how many of them finished the request,
-- and how many rows' commit_len disagrees with the tokens actually committed.
-- Why: the distribution behind "mean commit length"; a spike at commit_len 1 is a drafter
-- that never lands, mass above budget + 1 is impossible (a counter bug), and
-- tokens_disagree > 0 means the counter and the committed tokens tell different stories.
-- Example: specaudit query traces/ commit_length_histogram --output-format csv
-- Columns: config, commit_len, steps, share, finished_steps, tokens_disagree
WITH per_run AS (
    SELECT
        run_id,
        commit_len,
        count(*) AS n,
        count(*) FILTER (WHERE finished) AS n_finished,
        count(*) FILTER (WHERE commit_len IS DISTINCT FROM len(committed_tokens)) AS n_disagree
    FROM steps
    GROUP BY ALL
),
per_cfg AS (
    SELECT
        coalesce(r.config, p.run_id) AS config,
        p.commit_len,
        sum(p.n) AS n,
        sum(p.n_finished) AS n_finished,
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
    n_disagree::BIGINT AS tokens_disagree
FROM per_cfg
ORDER BY config, commit_len
