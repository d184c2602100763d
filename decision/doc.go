// Package decision holds the contract between sluice's two loops: the
// decision record an enforcer writes for every request it decides, its
// outcomes, reasons and paths, the Sink interface the enforcer logs to, and
// the record's protobuf codec (schema in decisionpb/decision.proto).
//
// It imports nothing of sluice's but rules, and links no Kafka, Redis or
// ClickHouse client, so that any producer (a gateway, a second Kafka client,
// a replay) and any consumer can share it.
//
// Shapes: a Record holds the event time (ms in the record), region,
// enforcer instance, request id, domain, the descriptors (api key, user,
// tenant, client IP normalised, ASN, JA4, method, route, path, account, org,
// tier, custom), user agent, the matched rule ids, the Outcome, the denying
// and the would-deny (shadow) rule, the Path the decision took, cost,
// remaining, decision latency and, once known, the response status. ToProto
// and Decode map it to and from decisionpb.Decision (schema version
// SchemaVersion; bounds MaxValueLen, MaxPathLen, MaxListLen); RecordKey is
// the Kafka key that keeps one limit key in one partition.
package decision
