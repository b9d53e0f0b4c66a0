-- Acceptance against draft log-prob (drafter calibration), per config
--
-- What: every drafted node whose parent is on the accepted path ("reached": verification
-- looked at it), binned by its draft probability exp(draft_logprob); per bin, how many were
-- reached, how many accepted, the acceptance rate and the mean draft probability.
-- Why: a calibrated drafter's accept_rate tracks mean_draft_p (the diagonal). A drafter
-- above the diagonal is under-confident, below it over-confident; a flat line means its
-- confidence carries no information (wrong drafter weights, or a verify-side bug that
-- rejects good drafts: compare with acceptance_by_depth and with a chain run).
-- Chain rows (algo chain or topk 1) use parents[i] = i - 1 and an accepted path that is
-- a prefix, as the contract requires (specaudit check enforces both); tree rows test
-- each node's parent against the accepted path. Rows without draft_logprob are skipped.
-- param bins: number of equal-width draft-probability bins (default 10)
-- Example: specaudit query traces/ acceptance_vs_draft_logprob --param bins=20
-- Columns: config, bin, p_lo, p_hi, reached, accepted, accept_rate, mean_draft_p
WITH nb AS (
    SELECT coalesce(getvariable('bins'), 10)::INTEGER AS bins
),
chain_rows AS (
    -- reached nodes of a chain: 1 .. d+1 (clipped to the block); accepted: 1 .. d
    SELECT run_id, len(accepted_path) - 1 AS d,
           draft_logprob[2 : len(accepted_path) + 1] AS lps
    FROM steps
    WHERE (algo = 'chain' OR topk = 1) AND draft_logprob IS NOT NULL
),
chain_nodes AS (
    SELECT run_id, d, unnest(lps) AS lp, unnest(range(len(lps))) AS j
    FROM chain_rows
),
tree_rows AS (
    -- trees of up to 64 nodes: the accepted path as a bit set, so "is my parent on the
    -- path" is a shift per node instead of a list search
    SELECT run_id,
           list_aggregate(list_transform(accepted_path, lambda i: CASE WHEN i BETWEEN 0 AND 63
               THEN (1::UBIGINT << i) ELSE 0::UBIGINT END), 'bit_or') AS bits,
           unnest(draft_logprob) AS lp, unnest(parents) AS parent,
           unnest(range(len(parents))) AS node
    FROM steps
    WHERE NOT (algo = 'chain' OR topk = 1) AND draft_logprob IS NOT NULL AND len(parents) <= 64
),
big_tree_rows AS (
    -- larger trees: search the path list
    SELECT run_id, accepted_path,
           unnest(draft_logprob) AS lp, unnest(parents) AS parent,
           unnest(range(len(parents))) AS node
    FROM steps
    WHERE NOT (algo = 'chain' OR topk = 1) AND draft_logprob IS NOT NULL AND len(parents) > 64
),
tree_nodes AS (
    SELECT run_id, lp, ((bits >> node) & 1) = 1 AS accepted
    FROM tree_rows
    WHERE node > 0 AND parent >= 0 AND ((bits >> parent) & 1) = 1
    UNION ALL
    SELECT run_id, lp, list_contains(accepted_path, node) AS accepted
    FROM big_tree_rows
    WHERE node > 0 AND list_contains(accepted_path, parent)
),
reached AS (
    SELECT run_id, lp, j < d AS accepted FROM chain_nodes
    UNION ALL
    SELECT run_id, lp, accepted FROM tree_nodes
),
binned AS (
    SELECT run_id, least(floor(exp(lp) * nb.bins), nb.bins - 1)::INTEGER AS bin,
           count(*) AS n, count(*) FILTER (WHERE accepted) AS a, sum(exp(lp)) AS p
    FROM reached, nb
    WHERE lp IS NOT NULL AND NOT isnan(lp)
    GROUP BY ALL
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
