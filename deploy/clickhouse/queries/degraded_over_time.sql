-- degraded_over_time: per minute and region, the decisions taken while the
-- limiter's storage failed (degraded_open: a fail-open rule allowed;
-- degraded_closed: a fail-closed rule denied), out of all decisions. Read
-- from the per-minute aggregates; minutes without a degraded decision are
-- left out.
-- Parameters: from, to (Unix seconds).
SELECT
    minute,
    region,
    sumIf(n, outcome = 'degraded_open') AS degraded_open,
    sumIf(n, outcome = 'degraded_closed') AS degraded_closed,
    sum(n) AS decisions,
    round((degraded_open + degraded_closed) / decisions, 4) AS degraded_ratio
FROM (
    SELECT minute, region, outcome, uniqExactMerge(requests) AS n
    FROM decisions_per_minute
    WHERE minute >= toStartOfMinute(toDateTime(@from)) AND minute < toDateTime(@to)
    GROUP BY minute, region, outcome
)
GROUP BY minute, region
HAVING degraded_open + degraded_closed > 0
ORDER BY minute, region
