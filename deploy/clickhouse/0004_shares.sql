-- The share history: every version of every region's share of a global rule
-- published to the output topic (records keyed share/<rule>/<key>/<region>).
-- One row per (rule, key, region, version); duplicates collapse (FINAL).
-- computed_at is the end of the event-time window the aggregator computed it
-- for; published_at is when it reached Kafka (wall time).
CREATE TABLE IF NOT EXISTS shares (
    computed_at     DateTime('UTC'),
    rule_id         String,
    key             String,
    region          String,
    fraction        Float64,
    version         Int64,
    published_at    DateTime('UTC'),
    kafka_partition Int32,
    kafka_offset    Int64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(computed_at)
ORDER BY (rule_id, key, region, version);
