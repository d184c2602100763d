-- shadow_would_block: what each shadow-mode rule would have blocked, by key.
-- would_block counts the requests the rule would have denied (shadow_rule);
-- of them, denied_anyway were denied by an enforcing rule all the same.
-- Parameters: from, to (Unix seconds), limit (keys per rule).
SELECT
    shadow_rule AS rule,
    entity AS key,
    count() AS would_block,
    countIf(outcome = 'denied') AS denied_anyway
FROM decisions FINAL
WHERE shadow_rule != ''
  AND event_time >= toDateTime(@from) AND event_time < toDateTime(@to)
GROUP BY rule, key
ORDER BY rule, would_block DESC, key
LIMIT @limit BY rule
