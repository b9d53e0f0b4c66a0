-- Violations by code
--
-- What: the checker's findings grouped by rule code and severity: how many, in how many
-- runs and requests, and one example message (the numbers that broke the rule).
-- Why: the first screen of a post-mortem. Error codes are impossibilities in the trace
-- (a counter that contradicts the rows, a mask that is not the tree's); `specaudit rules`
-- explains each code. Empty when the checker found nothing (or was not run: the command
-- runs it whenever the SQL names the violations view).
-- Example: specaudit query traces/ violations_by_code
-- Columns: code, name, severity, findings, runs, requests, steps, example
SELECT
    code,
    any_value(name) AS name,
    severity,
    count(*)::BIGINT AS findings,
    count(DISTINCT run_id)::BIGINT AS runs,
    count(DISTINCT run_id || '/' || request_id)::BIGINT AS requests,
    count(step)::BIGINT AS steps,
    min(message) AS example
FROM violations
GROUP BY code, severity
ORDER BY CASE severity WHEN 'error' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, findings DESC, code
