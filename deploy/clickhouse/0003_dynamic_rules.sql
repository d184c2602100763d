-- The dynamic-rule audit: every version of every rule published to the
-- output topic (sluice.output, records keyed rule/<id>), with its scope,
-- reason and evidence. One row per (rule, version); a redelivered record has
-- the same key and is collapsed by ReplacingMergeTree (read with FINAL).
-- version_time is the version as a time: the end of the event-time window
-- that produced it (a replay's times are the log's); published_at is when it
-- reached Kafka (wall time).
CREATE TABLE IF NOT EXISTS dynamic_rules (
    version_time    DateTime('UTC'),
    published_at    DateTime('UTC'),
    rule_id         String,
    version         Int64,
    origin          String,
    mode            String,
    algorithm       String,
    rule_limit      Int64,
    period_ms       Int64,
    scope           String,
    reason          String,
    evidence_keys   Array(String),
    evidence_values Array(String),
    expires_at      DateTime('UTC'),
    rule_json       String,
    kafka_partition Int32,
    kafka_offset    Int64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(version_time)
ORDER BY (rule_id, version);
