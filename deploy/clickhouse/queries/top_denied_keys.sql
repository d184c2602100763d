-- top_denied_keys: the keys with the most denied requests, and the rule
-- that denied them. A key is the record's primary limit entity, as its
-- Kafka key names it: api_key=..., else user=..., else client_ip=....
-- Parameters (bound by sluice report): from, to (Unix seconds, [from, to)), limit.
SELECT
    entity AS key,
    denying_rule AS rule,
    count() AS denied,
    uniqExact(region) AS regions,
    min(event_time) AS first,
    max(event_time) AS last
FROM decisions FINAL
WHERE outcome = 'denied'
  AND event_time >= toDateTime(@from) AND event_time < toDateTime(@to)
GROUP BY key, rule
ORDER BY denied DESC, key, rule
LIMIT @limit
