-- Decision records, one row per record of the `decisions` topic.
--
-- ReplacingMergeTree: rows with the same sorting key are one record delivered
-- more than once (the sink is at-least-once). Merges keep one of them in the
-- background; reports read with FINAL, which collapses them at query time, so
-- a redelivered batch never counts twice. The key ends with request_id (the
-- enforcer's, or kafka:<topic>/<partition>/<offset> for a record without one),
-- after the columns the reports filter and group on. A duplicate has the same
-- event time, so it is in the same day's partition: FINAL only collapses rows
-- within one partition.
--
-- Runs on ClickHouse 18.16 (Debian) and current ClickHouse: no DateTime64,
-- Map or LowCardinality (DateTime plus the milliseconds; arrays for custom
-- descriptors).
CREATE TABLE IF NOT EXISTS decisions (
    event_time      DateTime('UTC'),
    event_time_ms   Int64,
    region          String,
    instance        String,
    request_id      String,
    request_id_derived UInt8,
    domain          String,
    entity          String,
    api_key         String,
    user            String,
    tenant          String,
    client_ip       String,
    asn             UInt32,
    ja4             String,
    method          String,
    route           String,
    path            String,
    account         String,
    org             String,
    tier            String,
    custom_keys     Array(String),
    custom_values   Array(String),
    user_agent      String,
    matched_rules   Array(String),
    outcome         Enum8('allowed' = 1, 'denied' = 2, 'shadow_denied' = 3, 'degraded_open' = 4, 'degraded_closed' = 5),
    denying_rule    String,
    shadow_rule     String,
    cost            UInt32,
    remaining       Int64,
    latency_us      UInt32,
    status          UInt32,
    decision_path   Enum8('unspecified' = 0, 'redis' = 1, 'deny_cache' = 2, 'lease' = 3, 'fallback' = 4, 'blocked' = 5),
    kafka_partition Int32,
    kafka_offset    Int64
) ENGINE = ReplacingMergeTree()
PARTITION BY toDate(event_time)
ORDER BY (outcome, region, event_time, request_id);
