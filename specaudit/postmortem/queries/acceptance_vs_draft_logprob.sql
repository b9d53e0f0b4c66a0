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
    SELECT coalesce(getvariable('bins'), 10)::INTEGER AS bins
),
chain_rows AS (
    -- (node streams carry hash(run_id), an integer, not the run_id string: grouping
    -- millions of nodes on an integer is cheaper; the run comes back by the same hash)
    -- a chain's accepted nodes are 1 .. d and its only other reached node is d+1 (the
    -- first rejected draft, absent when the whole block was accepted)
    SELECT hash(run_id) AS run_id, len(accepted_path) - 1 AS d, draft_logprob
    FROM steps
    WHERE topk = 1 AND draft_logprob IS NOT NULL
),
chain_nodes AS (
    SELECT run_id, unnest(draft_logprob[2 : d + 1]) AS lp, true AS accepted
    FROM chain_rows
    UNION ALL
    SELECT run_id, draft_logprob[d + 2] AS lp, false AS accepted
    FROM chain_rows
    WHERE d + 2 <= len(draft_logprob)
),
tree_rows AS (
    -- the accepted path as a bit set (trees up to 64 nodes) or a '0'/'1' string (larger
    -- ones), computed once per row, so "is my parent on the path" is a shift per node
    SELECT hash(run_id) AS run_id, draft_logprob, parents, len(parents) AS n,
           CASE WHEN len(parents) <= 64 THEN
               list_aggregate(list_transform(accepted_path, lambda i: CASE WHEN i BETWEEN 0 AND 63
                   THEN (1::UBIGINT << i) ELSE 0::UBIGINT END), 'bit_or') END AS bits,
           CASE WHEN len(parents) > 64 THEN
               list_aggregate(list_transform(range(len(parents)), lambda i:
                   CASE WHEN list_contains(accepted_path, i) THEN '1' ELSE '0' END), 'string_agg', '')
               END AS mask
    FROM steps
    WHERE (topk <> 1 OR topk IS NULL) AND draft_logprob IS NOT NULL
),
tree_unnested AS (
    SELECT run_id, n, bits, mask, unnest(draft_logprob) AS lp, unnest(parents) AS parent,
           unnest(range(n)) AS node
    FROM tree_rows
),
tree_nodes AS (
    SELECT run_id, lp,
           CASE WHEN n <= 64 THEN ((bits >> node) & 1) = 1
                ELSE substring(mask, node + 1, 1) = '1' END AS accepted
    FROM tree_unnested
    WHERE node > 0 AND parent >= 0 AND parent < n
      AND CASE WHEN n <= 64 THEN ((bits >> parent) & 1) = 1
               ELSE substring(mask, parent + 1, 1) = '1' END
),
reached AS (
    SELECT run_id, lp, accepted FROM chain_nodes
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
    coalesce(r.config, r.rid) AS config,
    b.bin,
    b.bin / nb.bins AS p_lo,
    (b.bin + 1) / nb.bins AS p_hi,
    sum(b.n)::BIGINT AS reached,
    sum(b.a)::BIGINT AS accepted,
    sum(b.a) / sum(b.n) AS accept_rate,
    sum(b.p) / sum(b.n) AS mean_draft_p
FROM binned AS b LEFT JOIN (SELECT hash(run_id) AS h, run_id AS rid, config FROM runs) AS r ON r.h = b.run_id, nb
GROUP BY coalesce(r.config, r.rid), b.bin, nb.bins
ORDER BY config, bin
