-- key_denials: one API key's denied requests per denying rule over the
-- hour and the day before now: the denial counts of the sidecar's
-- GET /v1/usage (analytics.KeyDenials), not a report. Read with FINAL, so a
-- redelivered record counts once.
-- Parameters: api_key, now (Unix seconds; [now - 1 day, now)).
SELECT
    denying_rule AS rule,
    countIf(event_time >= toDateTime(@now - 3600)) AS last_hour,
    count() AS last_day
FROM decisions FINAL
WHERE api_key = @api_key AND outcome = 'denied'
  AND event_time >= toDateTime(@now - 86400) AND event_time < toDateTime(@now)
GROUP BY rule
ORDER BY rule
