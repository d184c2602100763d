-- key_usage: one API key's requests by hour and rule: what a customer asks
-- when they want to know why they were limited. Each request counts once in
-- the hour's "(all)" row and once in the row of every rule it matched
-- ("(none)" when it matched none), so the rule rows of an hour need not sum
-- to its "(all)" row. allowed counts the requests let through (allowed,
-- shadow-denied, degraded-open); denied those a rule denied (in a rule's
-- row: that rule); unavailable those a fail-closed rule refused while Redis
-- was unavailable (degraded_closed). Read with FINAL, so a redelivered
-- record counts once.
-- Parameters (bound by sluice report): from, to (Unix seconds, [from, to)), api_key.
SELECT
    toStartOfHour(event_time) AS hour,
    arrayJoin(arrayConcat(['(all)'], if(empty(matched_rules), ['(none)'], matched_rules))) AS rule,
    count() AS requests,
    countIf(outcome IN ('allowed', 'shadow_denied', 'degraded_open')) AS allowed,
    countIf(outcome = 'denied' AND (rule = '(all)' OR denying_rule = rule)) AS denied,
    countIf(outcome = 'degraded_closed' AND (rule = '(all)' OR denying_rule = rule)) AS unavailable
FROM decisions FINAL
WHERE api_key = @api_key
  AND event_time >= toDateTime(@from) AND event_time < toDateTime(@to)
GROUP BY hour, rule
ORDER BY hour, rule = '(all)' DESC, rule
