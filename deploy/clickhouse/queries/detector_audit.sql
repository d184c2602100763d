-- detector_audit: each dynamic rule with a version in [from, to) (its
-- version is the end of the event-time window that produced it), then its
-- evidence (of its newest version), then its effect on traffic in [from, to):
-- the requests it matched, those it denied, those it would have denied in
-- shadow mode.
-- Parameters: from, to (Unix seconds).
SELECT
    rule_id AS rule,
    origin,
    mode,
    scope,
    evidence,
    first_version,
    versions,
    matched,
    denied,
    would_deny
FROM (
    SELECT
        rule_id,
        argMax(origin, version) AS origin,
        argMax(mode, version) AS mode,
        argMax(scope, version) AS scope,
        argMax(arrayStringConcat(arrayMap((k, v) -> concat(k, '=', v), evidence_keys, evidence_values), ' '), version) AS evidence,
        min(version_time) AS first_version,
        count() AS versions
    FROM dynamic_rules FINAL
    WHERE version_time >= toDateTime(@from) AND version_time < toDateTime(@to)
    GROUP BY rule_id
)
ANY LEFT JOIN (
    SELECT
        rule_id,
        count() AS matched,
        countIf(outcome = 'denied' AND denying_rule = rule_id) AS denied,
        countIf(shadow_rule = rule_id) AS would_deny
    FROM decisions FINAL
    ARRAY JOIN matched_rules AS rule_id
    WHERE event_time >= toDateTime(@from) AND event_time < toDateTime(@to)
    GROUP BY rule_id
) USING rule_id
ORDER BY first_version, rule
