-- region_shares: per global rule and region, the region's usage against its
-- share. share is the region's newest default share (key '') computed before
-- the end of the range, versions the share updates within it; requests the
-- region's requests that matched the rule, denied those this rule denied
-- (or failed closed on), usage their part of all regions'.
-- Shares and usage are rounded to 4 decimals.
-- Parameters: from, to (Unix seconds).
SELECT
    rule_id AS rule,
    region,
    share,
    versions,
    requests,
    denied,
    if(total = 0, 0, round(requests / total, 4)) AS usage
FROM (
    SELECT
        rule_id,
        region,
        round(argMax(fraction, version), 4) AS share,
        countIf(computed_at >= toDateTime(@from)) AS versions
    FROM shares FINAL
    WHERE key = '' AND computed_at < toDateTime(@to)
    GROUP BY rule_id, region
)
ANY LEFT JOIN (
    SELECT rule_id, region, requests, denied, total
    FROM (
        SELECT rule_id, region, count() AS requests,
            countIf(outcome IN ('denied', 'degraded_closed') AND denying_rule = rule_id) AS denied
        FROM decisions FINAL
        ARRAY JOIN matched_rules AS rule_id
        WHERE event_time >= toDateTime(@from) AND event_time < toDateTime(@to)
        GROUP BY rule_id, region
    )
    ANY LEFT JOIN (
        SELECT rule_id, count() AS total
        FROM decisions FINAL
        ARRAY JOIN matched_rules AS rule_id
        WHERE event_time >= toDateTime(@from) AND event_time < toDateTime(@to)
        GROUP BY rule_id
    ) USING rule_id
) USING rule_id, region
ORDER BY rule, region
