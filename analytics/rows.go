package analytics

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// The INSERT statements, with explicit column lists: a column added by a
// later migration (with a default) does not break an older sink.
const (
	insertDecisions = `INSERT INTO decisions (event_time, event_time_ms, region, instance, request_id, request_id_derived,
	domain, entity, api_key, user, tenant, client_ip, asn, ja4, method, route, path, account, org, tier,
	custom_keys, custom_values, user_agent, matched_rules, outcome, denying_rule, shadow_rule, cost, remaining,
	latency_us, status, decision_path, kafka_partition, kafka_offset)`
	insertRules = `INSERT INTO dynamic_rules (version_time, published_at, rule_id, version, origin, mode, algorithm, rule_limit,
	period_ms, scope, reason, evidence_keys, evidence_values, expires_at, rule_json, kafka_partition, kafka_offset)`
	insertShares = `INSERT INTO shares (computed_at, rule_id, key, region, fraction, version, published_at,
	kafka_partition, kafka_offset)`
)

// Tables the sink writes to, the table label of
// sluice_clickhouse_rows_written_total.
const (
	TableDecisions = "decisions"
	TableRules     = "dynamic_rules"
	TableShares    = "shares"
)

// Reasons a record is skipped, the reason label of
// sluice_clickhouse_skipped_records_total.
const (
	SkipBadDecision = "bad_decision" // the decision record does not decode (decision.Decode)
	SkipBadOutput   = "bad_output"   // the output record does not decode (pipeline.DecodeOutputRecord)
	SkipPunctuation = "punctuation"  // a watermark marker of the decision topic, not a decision
	SkipOutOfRange  = "out_of_range" // an event time past 2106, which DateTime cannot hold
)

var outcomeNames = map[decisionpb.Outcome]string{
	decisionpb.Outcome_OUTCOME_ALLOWED:         "allowed",
	decisionpb.Outcome_OUTCOME_DENIED:          "denied",
	decisionpb.Outcome_OUTCOME_SHADOW_DENIED:   "shadow_denied",
	decisionpb.Outcome_OUTCOME_DEGRADED_OPEN:   "degraded_open",
	decisionpb.Outcome_OUTCOME_DEGRADED_CLOSED: "degraded_closed",
}

var pathNames = map[decisionpb.Path]string{
	decisionpb.Path_PATH_REDIS:      "redis",
	decisionpb.Path_PATH_DENY_CACHE: "deny_cache",
	decisionpb.Path_PATH_LEASE:      "lease",
	decisionpb.Path_PATH_FALLBACK:   "fallback",
	decisionpb.Path_PATH_BLOCKED:    "blocked",
	decisionpb.Path_PATH_NO_SHARE:   "no_share",
	decisionpb.Path_PATH_LOCAL:      "local",
	decisionpb.Path_PATH_SHED:       "shed",
}

// maxDateTime is the last second a ClickHouse DateTime holds (UInt32).
var maxDateTime = time.Unix(1<<32-1, 0).UTC()

// dateTime clamps t into DateTime's range, 1970 to 2106.
func dateTime(t time.Time) time.Time {
	switch {
	case t.Before(time.Unix(0, 0)):
		return time.Unix(0, 0).UTC()
	case t.After(maxDateTime):
		return maxDateTime
	}
	return t.UTC()
}

// DerivedRequestID is the request id the sink gives a decision record that
// has none: its place in Kafka, kafka:<topic>/<partition>/<offset>. A
// redelivery of the record gets the same id, so it is deduplicated like any
// other; two records that a producer wrote twice (franz-go's idempotent
// producer does not) would not be.
func DerivedRequestID(topic string, partition int32, offset int64) string {
	return fmt.Sprintf("kafka:%s/%d/%d", topic, partition, offset)
}

// batch holds one flush's rows, per table.
type batch struct {
	decisions, rules, shares [][]any
	skipped                  map[string]int
}

func (b *batch) skip(reason string) {
	if b.skipped == nil {
		b.skipped = map[string]int{}
	}
	b.skipped[reason]++
}

// add converts one Kafka record into a row of its table, or skips it.
func (b *batch) add(rec *kgo.Record, decisionTopic string) {
	if rec.Topic == decisionTopic {
		b.addDecision(rec)
		return
	}
	or, err := pipeline.DecodeOutputRecord(rec.Key, rec.Value)
	if err != nil {
		b.skip(SkipBadOutput)
		return
	}
	switch or.Kind {
	case pipeline.KindRule:
		b.rules = append(b.rules, ruleRow(rec, or.Rule))
	case pipeline.KindShare:
		s := or.Share
		b.shares = append(b.shares, []any{dateTime(s.ComputedAt), s.RuleID, s.Key, s.Region, s.Fraction, s.Version,
			dateTime(rec.Timestamp), rec.Partition, rec.Offset})
	}
}

func (b *batch) addDecision(rec *kgo.Record) {
	for _, h := range rec.Headers {
		if h.Key == stage.PunctuationHeader {
			b.skip(SkipPunctuation)
			return
		}
	}
	d, err := decision.Decode(rec.Value)
	if err != nil {
		b.skip(SkipBadDecision)
		return
	}
	t := time.UnixMilli(d.EventTimeMs)
	if t.After(maxDateTime) {
		b.skip(SkipOutOfRange)
		return
	}
	id, derived := d.RequestId, uint8(0)
	if id == "" {
		id, derived = DerivedRequestID(rec.Topic, rec.Partition, rec.Offset), 1
	}
	x := d.GetDescriptors()
	desc := decision.Descriptors(d)
	ck, cv := customDescriptors(x.GetCustom())
	path, ok := pathNames[d.Path]
	if !ok {
		path = "unspecified" // none, or a path this sink does not know
	}
	matched := d.MatchedRules
	if matched == nil {
		matched = []string{}
	}
	b.decisions = append(b.decisions, []any{
		t.UTC(), d.EventTimeMs, d.Region, d.Instance, id, derived,
		d.Domain, string(decision.RecordKey(&desc)), x.GetApiKey(), x.GetUser(), x.GetTenant(), x.GetClientIp(), x.GetAsn(),
		x.GetJa4(), x.GetMethod(), x.GetRoute(), x.GetPath(), x.GetAccount(), x.GetOrg(), x.GetTier(),
		ck, cv, d.UserAgent, matched, outcomeNames[d.Outcome], d.DenyingRule, d.ShadowRule, d.Cost, d.Remaining,
		d.LatencyUs, d.Status, path, rec.Partition, rec.Offset,
	})
}

// customDescriptors returns the custom descriptors as two arrays sorted by
// name.
func customDescriptors(m map[string]string) (keys, values []string) {
	keys = make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	values = make([]string, len(keys))
	for i, k := range keys {
		values[i] = m[k]
	}
	return keys, values
}

// ruleRow is one row of dynamic_rules.
func ruleRow(rec *kgo.Record, r *rules.Rule) []any {
	scope := make([]string, len(r.Match))
	for i := range r.Match {
		scope[i] = r.Match[i].KeyName() + " " + r.Match[i].Condition()
	}
	ek, ev := customDescriptors(r.Evidence)
	js, err := json.Marshal(r)
	if err != nil { // a decoded rule always encodes; keep the row regardless
		js = []byte("{}")
	}
	expires := time.Unix(0, 0)
	if !r.ExpiresAt.IsZero() {
		expires = r.ExpiresAt
	}
	return []any{dateTime(time.UnixMilli(r.Version)), dateTime(rec.Timestamp), r.ID, r.Version, r.Origin, r.Mode.String(), r.Algorithm.String(), r.Limit,
		r.Period.Milliseconds(), strings.Join(scope, "; "), r.Reason, ek, ev, dateTime(expires), string(js),
		rec.Partition, rec.Offset}
}

// insert writes rows to a table with one INSERT; it returns once
// ClickHouse acknowledged them.
func insert(ctx context.Context, conn driver.Conn, query string, rows [][]any) error {
	if len(rows) == 0 {
		return nil
	}
	b, err := conn.PrepareBatch(ctx, query)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if err := b.Append(r...); err != nil {
			_ = b.Abort()
			return err
		}
	}
	return b.Send()
}
