-- Per-minute aggregates of the decisions, filled by a materialized view on
-- every insert into decisions.
--
-- A materialized view sees each inserted block, duplicates included: a
-- redelivered batch is aggregated again. So the aggregate is not a count but
-- the set of request ids (uniqExactState): merging the states of a minute
-- (uniqExactMerge) counts each request once however often it was inserted.
-- The price is 16 bytes per decision per (minute, region, outcome, rule)
-- group; sum- or count-states would be smaller and would double count.
CREATE TABLE IF NOT EXISTS decisions_per_minute (
    minute       DateTime('UTC'),
    region       String,
    outcome      Enum8('allowed' = 1, 'denied' = 2, 'shadow_denied' = 3, 'degraded_open' = 4, 'degraded_closed' = 5),
    denying_rule String,
    shadow_rule  String,
    requests     AggregateFunction(uniqExact, String)
) ENGINE = AggregatingMergeTree()
PARTITION BY toDate(minute)
ORDER BY (minute, region, outcome, denying_rule, shadow_rule);

CREATE MATERIALIZED VIEW IF NOT EXISTS decisions_per_minute_mv TO decisions_per_minute AS
SELECT
    toStartOfMinute(event_time) AS minute,
    region,
    outcome,
    denying_rule,
    shadow_rule,
    uniqExactState(request_id) AS requests
FROM decisions
GROUP BY minute, region, outcome, denying_rule, shadow_rule;
