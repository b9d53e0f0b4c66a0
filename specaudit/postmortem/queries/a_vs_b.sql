-- A against B: two runs (or two configs) side by side
--
-- What: the headline numbers of side A and side B and their difference and ratio: steps,
-- requests, drafted and accepted draft tokens, acceptance rate (accepted / drafted), mean
-- accepted depth and commit length (from the rows), tokens per second of wall time, and
-- mean draft / verify / step time. A side is every run whose run_id or config label
-- equals the parameter (so repeated runs of one config pool together).
-- Why: "metric right, acceptance degraded": a counter can be honest while acceptance
-- silently drops (a CUDA-graph path, a new kernel, a changed drafter). Put the suspect run
-- next to a known-good one; b_over_a far from 1 on accept_rate with equal configs is the
-- finding. a and b are derived from the trace's raw tensors (len(committed_tokens),
-- len(accepted_path) - 1, the requests' output tokens over the run's wall_s), never from the
-- engine's counters; a_reported and b_reported are those counters (run.json, pooled over a
-- side's runs) beside them, and a_verdict / b_verdict the one comparison rule's verdict.
-- param a: run_id or config label of side A (default: the run that started first)
-- param b: run_id or config label of side B (default: the run that started last)
-- Example: specaudit query traces/ a_vs_b --param a="chain b7 k1 c1" --param b=RUN_ID
-- Columns: metric, a, b, b_minus_a, b_over_a, a_runs, b_runs, a_reported, b_reported,
--          a_verdict, b_verdict
WITH sel AS (
    SELECT
        coalesce(getvariable('a')::VARCHAR,
                 (SELECT run_id FROM runs ORDER BY started_at NULLS LAST, run_id LIMIT 1)) AS a,
        coalesce(getvariable('b')::VARCHAR,
                 (SELECT run_id FROM runs ORDER BY started_at DESC NULLS LAST, run_id DESC LIMIT 1)) AS b
),
members AS (
    SELECT 'A' AS side, runs.run_id FROM runs, sel WHERE runs.run_id = sel.a OR runs.config = sel.a
    UNION ALL
    SELECT 'B' AS side, runs.run_id FROM runs, sel WHERE runs.run_id = sel.b OR runs.config = sel.b
),
checked AS (
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM members WHERE side = 'A')
            THEN error('a_vs_b: no run_id or config named ' || (SELECT a FROM sel) ||
                       '; see: specaudit query PATH "SELECT run_id, config FROM runs"')
        WHEN NOT EXISTS (SELECT 1 FROM members WHERE side = 'B')
            THEN error('a_vs_b: no run_id or config named ' || (SELECT b FROM sel) ||
                       '; see: specaudit query PATH "SELECT run_id, config FROM runs"')
        ELSE true END AS ok
),
per_run AS (
    -- rollup_request: drafted = sum(len(node_tokens) - 1), depth_sum = sum(len(accepted_path) - 1)
    SELECT
        run_id,
        sum(n) AS steps,
        sum(drafted) AS drafted,
        sum(depth_sum) AS accepted,
        sum(committed) AS committed,
        sum(step_s) AS step_s,
        sum(draft_s) AS draft_s,
        sum(verify_s) AS verify_s,
        max(t1) - min(t0) AS wall_s
    FROM rollup_request
    WHERE run_id IN (SELECT run_id FROM members)
    GROUP BY run_id
),
req AS (
    SELECT run_id, sum(n) AS requests, sum(generated) AS generated FROM rollup_outputs
    WHERE run_id IN (SELECT run_id FROM members)
    GROUP BY run_id
),
agg AS (
    SELECT
        m.side,
        string_agg(DISTINCT m.run_id, ', ' ORDER BY m.run_id) AS runs,
        sum(p.steps)::DOUBLE AS steps,
        sum(coalesce(q.requests, 0))::DOUBLE AS requests,
        sum(p.drafted)::DOUBLE AS drafted,
        sum(p.accepted)::DOUBLE AS accepted,
        sum(p.accepted) / nullif(sum(p.drafted), 0) AS accept_rate,
        sum(p.accepted) / sum(p.steps) AS mean_accepted_depth,
        sum(p.committed) / sum(p.steps) AS mean_commit_len,
        sum(coalesce(q.generated, p.committed)) / nullif(sum(coalesce(ru.reported_wall_s, p.wall_s)), 0)
            AS tokens_per_s,
        sum(p.draft_s) / sum(p.steps) AS mean_draft_s,
        sum(p.verify_s) / sum(p.steps) AS mean_verify_s,
        sum(p.step_s) / sum(p.steps) AS mean_step_s,
        sum(ru.reported_verify_steps) AS r_steps,
        sum(ru.reported_drafted_tokens) AS r_drafted,
        sum(ru.reported_accepted_tokens) AS r_accepted,
        sum(ru.reported_accepted_tokens) / nullif(sum(ru.reported_drafted_tokens), 0) AS r_accept_rate,
        sum(ru.reported_mean_accepted_depth * ru.reported_verify_steps) / nullif(sum(ru.reported_verify_steps), 0)
            AS r_mean_accepted_depth,
        sum(ru.reported_mean_commit_len * ru.reported_verify_steps) / nullif(sum(ru.reported_verify_steps), 0)
            AS r_mean_commit_len,
        sum(ru.reported_gen_throughput_tps * ru.reported_wall_s) / nullif(sum(ru.reported_wall_s), 0) AS r_tps
    FROM members AS m
    JOIN per_run AS p USING (run_id)
    JOIN runs AS ru USING (run_id)
    LEFT JOIN req AS q USING (run_id), checked
    WHERE checked.ok
    GROUP BY m.side
),
long AS (
    SELECT side, runs, unnest([
        {'i': 1, 'metric': 'steps', 'v': steps, 'r': r_steps},
        {'i': 2, 'metric': 'requests', 'v': requests, 'r': NULL},
        {'i': 3, 'metric': 'drafted_tokens', 'v': drafted, 'r': r_drafted},
        {'i': 4, 'metric': 'accepted_tokens', 'v': accepted, 'r': r_accepted},
        {'i': 5, 'metric': 'accept_rate', 'v': accept_rate, 'r': r_accept_rate},
        {'i': 6, 'metric': 'mean_accepted_depth', 'v': mean_accepted_depth, 'r': r_mean_accepted_depth},
        {'i': 7, 'metric': 'mean_commit_len', 'v': mean_commit_len, 'r': r_mean_commit_len},
        {'i': 8, 'metric': 'tokens_per_s', 'v': tokens_per_s, 'r': r_tps},
        {'i': 9, 'metric': 'mean_draft_s', 'v': mean_draft_s, 'r': NULL},
        {'i': 10, 'metric': 'mean_verify_s', 'v': mean_verify_s, 'r': NULL},
        {'i': 11, 'metric': 'mean_step_s', 'v': mean_step_s, 'r': NULL}
    ]) AS m
    FROM agg
)
SELECT
    m.metric,
    max(m.v) FILTER (WHERE side = 'A') AS a,
    max(m.v) FILTER (WHERE side = 'B') AS b,
    max(m.v) FILTER (WHERE side = 'B') - max(m.v) FILTER (WHERE side = 'A') AS b_minus_a,
    max(m.v) FILTER (WHERE side = 'B') / nullif(max(m.v) FILTER (WHERE side = 'A'), 0) AS b_over_a,
    max(runs) FILTER (WHERE side = 'A') AS a_runs,
    max(runs) FILTER (WHERE side = 'B') AS b_runs,
    max(m.r) FILTER (WHERE side = 'A') AS a_reported,
    max(m.r) FILTER (WHERE side = 'B') AS b_reported,
    CASE WHEN max(m.r) FILTER (WHERE side = 'A') IS NULL THEN NULL
         ELSE specaudit_agrees(max(m.r) FILTER (WHERE side = 'A'), max(m.v) FILTER (WHERE side = 'A')) END
        AS a_verdict,
    CASE WHEN max(m.r) FILTER (WHERE side = 'B') IS NULL THEN NULL
         ELSE specaudit_agrees(max(m.r) FILTER (WHERE side = 'B'), max(m.v) FILTER (WHERE side = 'B')) END
        AS b_verdict
FROM long
GROUP BY m.i, m.metric
ORDER BY m.i
