package decision

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/rules"
)

// SchemaVersion is the decision-record version this code writes and the
// newest it reads.
const SchemaVersion = 1

// MaxEventTimeMs is the start of the year 9000. Window ends and rule
// expiries derived from an event time must stay inside the years that
// time.Time writes as RFC 3339 (and JSON): a record past it is bad, not a
// write that fails for ever downstream.
const MaxEventTimeMs = 221845392000 * 1000

// ErrBadRecord is wrapped by every decode error.
var ErrBadRecord = errors.New("bad decision record")

// ToProto fills d from an enforcer record. d is reset first. Text fields
// longer than a decoder takes (MaxValueLen, MaxPathLen for the path and the
// user agent) are cut at a character boundary, so that a padded header does
// not make its record undecodable, which would hide its client from the
// detector and the aggregator; ToProto reports whether it cut any.
func ToProto(rec *Record, d *decisionpb.Decision) (truncated bool) {
	desc := d.Descriptors
	if desc == nil {
		desc = new(decisionpb.Descriptors)
	}
	proto.Reset(d)
	proto.Reset(desc)
	val := func(s string) string { return fit(s, MaxValueLen, &truncated) }
	long := func(s string) string { return fit(s, MaxPathLen, &truncated) }
	v := &rec.Descriptors
	asn, _ := strconv.ParseUint(v[rules.KeyASN], 10, 32)
	*desc = decisionpb.Descriptors{
		ApiKey: val(v[rules.KeyAPIKey]), User: val(v[rules.KeyUser]), Tenant: val(v[rules.KeyTenant]),
		ClientIp: val(v[rules.KeyClientIP]), Asn: uint32(asn), Ja4: val(v[rules.KeyJA4]),
		Method: val(v[rules.KeyMethod]), Route: val(v[rules.KeyRoute]), Path: long(v[rules.KeyPath]),
		Account: val(v[rules.KeyAccount]), Org: val(v[rules.KeyOrg]), Tier: val(v[rules.KeyTier]),
	}
	for i := range rules.MaxCustom {
		if name, x := v.CustomAt(i); name != "" && x != "" {
			if desc.Custom == nil {
				desc.Custom = make(map[string]string, 2)
			}
			desc.Custom[val(name)] = val(x)
		}
	}
	d.Version = SchemaVersion
	d.EventTimeMs = rec.Time.UnixMilli()
	d.Region, d.Instance, d.RequestId, d.Domain = val(rec.Region), val(rec.Instance), val(rec.RequestID), val(rec.Domain)
	d.Descriptors = desc
	d.UserAgent = long(rec.UserAgent)
	d.MatchedRules = rec.Matched
	d.Outcome = outcomeProto[rec.Outcome]
	d.DenyingRule = rec.DenyingRule
	d.Cost = rec.Cost
	d.Remaining = rec.Remaining
	d.LatencyUs = uint32(min(rec.Latency/time.Microsecond, 1<<32-1))
	d.Status = rec.Status
	d.Path = decisionpb.Path(rec.Path) // the enums share their numbers
	d.ShadowRule = rec.ShadowRule
	d.AdaptiveFactor = rec.AdaptiveFactor
	return truncated
}

// fit returns s as valid UTF-8 (see utf8Text) of at most n bytes, cut at a
// character boundary, and sets *cut when it had to cut.
func fit(s string, n int, cut *bool) string {
	s = utf8Text(s)
	if len(s) <= n {
		return s
	}
	*cut = true
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// utf8Text returns s, with each run of invalid UTF-8 bytes replaced by U+FFFD
// when it has any: protobuf strings must be UTF-8, and a record that fails to
// encode would hide its client from the detector. Valid text (nearly all)
// is returned as it is, without allocating.
func utf8Text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

var outcomeProto = [...]decisionpb.Outcome{
	Allowed:        decisionpb.Outcome_OUTCOME_ALLOWED,
	Denied:         decisionpb.Outcome_OUTCOME_DENIED,
	ShadowDenied:   decisionpb.Outcome_OUTCOME_SHADOW_DENIED,
	DegradedOpen:   decisionpb.Outcome_OUTCOME_DEGRADED_OPEN,
	DegradedClosed: decisionpb.Outcome_OUTCOME_DEGRADED_CLOSED,
}

// Decode parses and checks one decision record: the wire format, the schema
// version (1..SchemaVersion), a known outcome and a positive event time. Every
// error wraps ErrBadRecord.
func Decode(b []byte) (*decisionpb.Decision, error) {
	d := new(decisionpb.Decision)
	if err := proto.Unmarshal(b, d); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	if err := Check(d); err != nil {
		return nil, err
	}
	return d, nil
}

// Check applies Decode's checks to a record decoded by other means (a
// record built in memory, as a replay's are). Every error wraps ErrBadRecord.
func Check(d *decisionpb.Decision) error {
	switch {
	case d.Version == 0 || d.Version > SchemaVersion:
		return fmt.Errorf("%w: schema version %d, this consumer reads 1..%d", ErrBadRecord, d.Version, SchemaVersion)
	case d.Outcome <= decisionpb.Outcome_OUTCOME_UNSPECIFIED || d.Outcome > decisionpb.Outcome_OUTCOME_DEGRADED_CLOSED:
		return fmt.Errorf("%w: unknown outcome %d", ErrBadRecord, d.Outcome)
	case d.EventTimeMs <= 0 || d.EventTimeMs >= MaxEventTimeMs:
		return fmt.Errorf("%w: event time %d ms is not between 1970 and the year 9000", ErrBadRecord, d.EventTimeMs)
	}
	return checkSizes(d)
}

// Bounds on a decision record's fields. Stages keep descriptor values in
// their sketches (a top-k holds K of them), so one absurd value must not
// make a window's state too large to ship.
const (
	MaxValueLen = 1024 // bytes of a descriptor value, a rule id or a header-like field
	MaxPathLen  = 8192 // bytes of the path and the user agent
	MaxListLen  = 256  // matched rules, custom descriptors
)

var sizedFields = [...]string{"api_key", "user", "tenant", "client_ip", "ja4", "method", "route",
	"account", "org", "tier", "region", "instance", "request_id", "domain", "denying_rule", "shadow_rule"}

// checkSizes rejects a record with a field past the bounds above.
func checkSizes(d *decisionpb.Decision) error {
	x := d.GetDescriptors()
	vals := [...]string{x.GetApiKey(), x.GetUser(), x.GetTenant(), x.GetClientIp(), x.GetJa4(), x.GetMethod(), x.GetRoute(),
		x.GetAccount(), x.GetOrg(), x.GetTier(), d.Region, d.Instance, d.RequestId, d.Domain, d.DenyingRule, d.ShadowRule}
	for i, v := range vals {
		if len(v) > MaxValueLen {
			return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrBadRecord, sizedFields[i], len(v), MaxValueLen)
		}
	}
	if len(x.GetPath()) > MaxPathLen || len(d.UserAgent) > MaxPathLen {
		return fmt.Errorf("%w: path or user agent longer than %d bytes", ErrBadRecord, MaxPathLen)
	}
	if len(d.MatchedRules) > MaxListLen || len(x.GetCustom()) > MaxListLen {
		return fmt.Errorf("%w: more than %d matched rules or custom descriptors", ErrBadRecord, MaxListLen)
	}
	for _, id := range d.MatchedRules {
		if len(id) > MaxValueLen {
			return fmt.Errorf("%w: a matched rule id is %d bytes, more than %d", ErrBadRecord, len(id), MaxValueLen)
		}
	}
	for k, v := range x.GetCustom() {
		if len(k) > MaxValueLen || len(v) > MaxValueLen {
			return fmt.Errorf("%w: custom descriptor %.32q is longer than %d bytes", ErrBadRecord, k, MaxValueLen)
		}
	}
	return nil
}

// Descriptors returns a record's descriptors in the rules package's form.
func Descriptors(d *decisionpb.Decision) rules.Descriptors {
	var v rules.Descriptors
	x := d.GetDescriptors()
	if x == nil {
		return v
	}
	v[rules.KeyAPIKey], v[rules.KeyUser], v[rules.KeyTenant] = x.ApiKey, x.User, x.Tenant
	v[rules.KeyClientIP], v[rules.KeyJA4] = x.ClientIp, x.Ja4
	if x.Asn != 0 {
		v[rules.KeyASN] = strconv.FormatUint(uint64(x.Asn), 10)
	}
	v[rules.KeyMethod], v[rules.KeyRoute], v[rules.KeyPath] = x.Method, x.Route, x.Path
	v[rules.KeyAccount], v[rules.KeyOrg], v[rules.KeyTier] = x.Account, x.Org, x.Tier
	for name, val := range x.Custom { // at most MaxCustom are kept; a record from another producer may carry more
		v.SetCustom(name, val)
	}
	return v
}

// RecordKey is the Kafka key of a decision record: its primary limit entity,
// the API key, else the user, else the client IP, prefixed with the
// descriptor's name. All decisions for one entity land in one partition.
func RecordKey(d *rules.Descriptors) []byte {
	for _, k := range [...]rules.Key{rules.KeyAPIKey, rules.KeyUser, rules.KeyClientIP} {
		if v := d[k]; v != "" {
			return append(append([]byte(k.String()), '='), v...)
		}
	}
	return nil
}
