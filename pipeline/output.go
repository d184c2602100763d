package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/sluice-rl/sluice/rules"
)

// DefaultOutputTopic is the topic a TopicWriter publishes stage output to
// and Appliers read it from.
const DefaultOutputTopic = "sluice.output"

// OutputFormat is the version of the output topic's record encoding (see
// OutputRecord) that writers write. Readers accept it and OutputFormatV1,
// and skip, and count, records of a format they do not know.
const OutputFormat = 2

// OutputFormatV1 is the format written before enums had names: a rule's
// keys were its Go field names ("FailureMode") and its Algorithm, Mode,
// FailureMode and Calendar bare integers (their const order). Format 2 writes
// snake_case keys and the enums' YAML names ("failure_mode":"closed"); the
// share is unchanged. DecodeOutputRecord reads both.
const OutputFormatV1 = 1

// Kind is what an output record carries.
type Kind string

// Kinds of output records.
const (
	KindRule  Kind = "rule"
	KindShare Kind = "share"
)

// ErrBadOutputRecord is wrapped by every error of DecodeOutputRecord.
var ErrBadOutputRecord = errors.New("pipeline: bad output record")

// OutputRecord is one record of the output topic: a dynamic rule or one
// region's share. Its Kafka key names what it is about, so that a compacted
// topic keeps the newest record of each:
//
//	rule/<rule id>                      a dynamic rule, for every region
//	share/<rule id>/<entity tag>/<region>  a share, for its region only ("" tag: the rule's default share)
//
// Its value is JSON, version 2 (OutputFormat):
//
//	{"format":2,"kind":"rule","version":<ms>,"rule":{"id":..,"algorithm":"token_bucket","mode":"shadow",...}}
//	{"format":2,"kind":"share","version":<ms>,"share":{...rules.Share...}}
//
// version is the event-time version of the rule or share (its Version: the
// end of the window that produced it, in Unix ms). Rules and shares are
// encoded as the rule store keeps them in Redis (store.Store), so the topic
// and the hashes hold the same JSON. A new field is added without a format
// change (readers ignore fields they do not know); a change that old readers
// would misread takes a new format, as the enums' names took format 2. A
// reader of format 1 only skips records of format 2: upgrade the readers
// (appliers, the analytics sink) before the writers.
type OutputRecord struct {
	Format  int          `json:"format"`
	Kind    Kind         `json:"kind"`
	Version int64        `json:"version"`
	Rule    *rules.Rule  `json:"rule,omitempty"`
	Share   *rules.Share `json:"share,omitempty"`
}

// Key returns the record's Kafka key.
func (r *OutputRecord) Key() string {
	if r.Kind == KindRule && r.Rule != nil {
		return RuleKey(r.Rule.ID)
	}
	if r.Kind == KindShare && r.Share != nil {
		return ShareKey(r.Share)
	}
	return ""
}

// RuleKey is the output-topic key of dynamic rule id.
func RuleKey(id string) string { return "rule/" + id }

// ShareKey is the output-topic key of a share.
func ShareKey(s *rules.Share) string {
	return "share/" + s.RuleID + "/" + s.Key + "/" + s.Region
}

// encodeRule and encodeShare return a record's key and value.
func encodeRule(r *rules.Rule) (key, value []byte, err error) {
	v, err := json.Marshal(&OutputRecord{Format: OutputFormat, Kind: KindRule, Version: r.Version, Rule: r})
	if err != nil {
		return nil, nil, fmt.Errorf("encoding rule %q: %w", r.ID, err)
	}
	return []byte(RuleKey(r.ID)), v, nil
}

func encodeShare(s *rules.Share) (key, value []byte, err error) {
	v, err := json.Marshal(&OutputRecord{Format: OutputFormat, Kind: KindShare, Version: s.Version, Share: s})
	if err != nil {
		return nil, nil, fmt.Errorf("encoding share %s: %w", ShareKey(s), err)
	}
	return []byte(ShareKey(s)), v, nil
}

// DecodeOutputRecord decodes one record of the output topic. It returns an
// error wrapping ErrBadOutputRecord, never panics, when the value is not
// JSON of a known format and kind, when the key is not the one its content
// names, or when the version differs from the content's. A rule is not
// validated here: the store does that when it is applied.
func DecodeOutputRecord(key, value []byte) (*OutputRecord, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w (key %.80q): %s", ErrBadOutputRecord, key, fmt.Sprintf(format, a...))
	}
	if len(value) == 0 {
		return nil, bad("no value (a tombstone?)")
	}
	var r OutputRecord
	if err := json.Unmarshal(value, &r); err != nil {
		return nil, bad("not JSON of the output format: %v", err)
	}
	if r.Format != OutputFormat && r.Format != OutputFormatV1 {
		return nil, bad("format %d: this reader knows %d and %d", r.Format, OutputFormatV1, OutputFormat)
	}
	switch {
	case r.Kind == KindRule && r.Rule != nil && r.Share == nil:
		if r.Version != r.Rule.Version {
			return nil, bad("version %d, rule version %d", r.Version, r.Rule.Version)
		}
	case r.Kind == KindShare && r.Share != nil && r.Rule == nil:
		s := r.Share
		if !rules.ValidID(s.RuleID) || !rules.ValidID(s.Region) || strings.Contains(s.Key, "/") {
			return nil, bad("share of rule %q, key %q, region %q: want rule ids and regions of [A-Za-z0-9_.-], a key without '/'", s.RuleID, s.Key, s.Region)
		}
		if math.IsNaN(s.Fraction) || s.Fraction < 0 || s.Fraction > 1 {
			return nil, bad("share fraction %v: want 0 to 1", s.Fraction)
		}
		if r.Version != s.Version {
			return nil, bad("version %d, share version %d", r.Version, s.Version)
		}
	default:
		return nil, bad("kind %q with rule %t and share %t: want a rule or a share", r.Kind, r.Rule != nil, r.Share != nil)
	}
	if k := r.Key(); k != string(key) {
		return nil, bad("its content's key is %q", k)
	}
	return &r, nil
}
