package rules

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"
)

// Redis keys and channel of the versioned static rule set in each region's
// Redis. The keys share the hash tag {ruleset}, so that one script updates
// them together on a Cluster. They have no TTL: they are a few kilobytes per
// region, and a rule set that expired would leave new enforcers with none.
const (
	// RuleSetKey is a hash holding the set in force: version (decimal),
	// yaml (the file's bytes), sha (hex SHA-256 of yaml), at (push time, Unix
	// ms, Redis's clock), by (the pusher) and from (for a rollback, the
	// version whose content it restores; else 0).
	RuleSetKey = "sluice:{ruleset}"
	// RuleSetHistoryKey is a hash holding the last versions (the current one
	// included): field "<v>" is version v's YAML, and "<v>:sha", "<v>:at",
	// "<v>:by", "<v>:from" its other fields.
	RuleSetHistoryKey = "sluice:{ruleset}:history"
	// RuleSetChannel carries a PUBLISH of the new version (decimal) on every
	// push and rollback.
	RuleSetChannel = "sluice:{ruleset}:notify"
	// DefaultHistory is how many versions the store keeps for rollback and
	// diff.
	DefaultHistory = 20
	// maxVersion keeps versions inside the integers a Lua number holds exactly.
	maxVersion = 1 << 53
)

// Errors of the rule-set store.
var (
	// ErrStaleVersion: a push named a version at or below the one in force.
	// Versions only grow, so that an enforcer can tell a new set from an old
	// or repeated one.
	ErrStaleVersion = errors.New("rule set version is not above the version in force")
	// ErrVersionMismatch: the YAML declares a version (top-level version:)
	// other than the one it is pushed or stored as.
	ErrVersionMismatch = errors.New("the rule file's version: differs from its version in the store")
	// ErrNoRuleSet: no rule set has been pushed to this Redis.
	ErrNoRuleSet = errors.New("no rule set in the store: push one with `sluice rules push`")
	// ErrNoPrevious: there is no earlier version in the history to roll back to.
	ErrNoPrevious = errors.New("no earlier version to roll back to")
	// ErrConflict: the set in force changed while a rollback was being
	// prepared; nothing was written. Run it again.
	ErrConflict = errors.New("the rule set changed meanwhile: nothing written; try again")
)

// Entry is one stored version of the static rule set.
type Entry struct {
	Version int64
	// YAML is the rule file as pushed; SHA its hex SHA-256.
	YAML []byte
	SHA  string
	// PushedAt is Redis's clock at the push (ms precision).
	PushedAt time.Time
	// Pusher names who pushed it (user@host from the CLI).
	Pusher string
	// From is, for a rollback, the version whose content this version
	// restores; 0 for a push.
	From int64
}

// Source returns the version whose content e is: From for a rollback, else
// Version.
func (e *Entry) Source() int64 {
	if e.From != 0 {
		return e.From
	}
	return e.Version
}

// Set parses the entry's YAML into a Set with the entry's version; the YAML
// may declare no version, or the same one, or for a rollback the version it
// restores (else ErrVersionMismatch). Errors
// name "redis:v<version>", the line and the column.
func (e *Entry) Set() (*Set, error) {
	name := "redis:v" + strconv.FormatInt(e.Version, 10)
	s, err := Parse(name, e.YAML)
	if err != nil {
		return nil, err
	}
	if d, err := DeclaredVersion(e.YAML); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	} else if d != 0 && d != e.Version && d != e.Source() {
		return nil, fmt.Errorf("%s: %w: the file says version %d", name, ErrVersionMismatch, d)
	}
	s.Version = e.Version
	return s, nil
}

// DeclaredVersion returns the top-level `version:` of a rule file, or 0 when
// it has none. It reads only that field; Parse checks the rest.
func DeclaredVersion(data []byte) (int64, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil || root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return 0, nil // not a mapping: Parse says why
	}
	m := root.Content[0]
	if m.Kind != yaml.MappingNode {
		return 0, nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value != "version" {
			continue
		}
		v := m.Content[i+1]
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || err != nil || n < 1 || n >= maxVersion {
			return 0, fmt.Errorf("line %d column %d: version %q: want a whole number from 1 to 2^53", v.Line, v.Column, v.Value)
		}
		return n, nil
	}
	return 0, nil
}

// SHA returns the hex SHA-256 of data, as Entry.SHA holds it.
func SHA(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// SetStore keeps the static rule set of one region's Redis: the version in
// force and a bounded history, written atomically, with a notification on
// RuleSetChannel for every new version (see Watcher). Its zero value is not
// usable: build one with NewSetStore. It is safe for concurrent use.
type SetStore struct {
	rdb     redis.UniversalClient
	pusher  string
	history int
}

// SetStoreOption configures a SetStore.
type SetStoreOption func(*SetStore)

// Pusher names who pushes (recorded with each version). Default "".
func Pusher(name string) SetStoreOption { return func(s *SetStore) { s.pusher = name } }

// KeepHistory sets how many versions are kept, the current one included:
// at least 2. Default DefaultHistory (20).
func KeepHistory(n int) SetStoreOption {
	return func(s *SetStore) { s.history = max(n, 2) }
}

// NewSetStore returns a SetStore over rdb.
func NewSetStore(rdb redis.UniversalClient, opts ...SetStoreOption) *SetStore {
	s := &SetStore{rdb: rdb, history: DefaultHistory}
	for _, o := range opts {
		o(s)
	}
	return s
}

// pushScript writes a version: it refuses a version at or below the one in
// force (or, with expect >= 0, any write unless the version in force is
// expect), writes the set and its history entry, drops the oldest history
// entries beyond keep, and publishes the version.
//
//	KEYS: RuleSetKey, RuleSetHistoryKey
//	ARGV: version (0: current+1), expect (-1: any), yaml, sha, by, from, keep, channel
//	returns {status, version, previous, at ms}: status 1 written, -1 stale, -2 conflict
var pushScript = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0') or 0
local expect = tonumber(ARGV[2])
if expect >= 0 and cur ~= expect then return {-2, cur, cur, 0} end
local v = tonumber(ARGV[1])
if v == 0 then v = cur + 1 elseif v <= cur then return {-1, v, cur, 0} end
local t = redis.call('TIME')
local at = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local vs = string.format('%d', v)
redis.call('HSET', KEYS[1], 'version', vs, 'yaml', ARGV[3], 'sha', ARGV[4], 'at', at, 'by', ARGV[5], 'from', ARGV[6])
redis.call('HSET', KEYS[2], vs, ARGV[3], vs .. ':sha', ARGV[4], vs .. ':at', at, vs .. ':by', ARGV[5], vs .. ':from', ARGV[6])
local kept = {}
for _, f in ipairs(redis.call('HKEYS', KEYS[2])) do
  if not string.find(f, ':', 1, true) then table.insert(kept, tonumber(f)) end
end
table.sort(kept)
for i = 1, #kept - tonumber(ARGV[7]) do
  local o = string.format('%d', kept[i])
  redis.call('HDEL', KEYS[2], o, o .. ':sha', o .. ':at', o .. ':by', o .. ':from')
end
redis.call('PUBLISH', ARGV[8], vs)
return {1, v, cur, tonumber(at)}
`)

// Push validates data as a rule file (Parse; name is used in its errors,
// which give name:line:column) and stores it as the version in force, in one
// atomic step that also records it in the history and publishes its version
// on RuleSetChannel.
//
// version 0 means the YAML's own top-level version: if it declares one, else
// the version in force + 1. A version at or below the one in force is
// refused with ErrStaleVersion; one that differs from the YAML's declared
// version with ErrVersionMismatch. Versions are at most 2^53.
func (s *SetStore) Push(ctx context.Context, name string, data []byte, version int64) (Entry, error) {
	if _, err := Parse(name, data); err != nil {
		return Entry{}, err
	}
	declared, err := DeclaredVersion(data)
	if err != nil {
		return Entry{}, fmt.Errorf("%s: %w", name, err)
	}
	switch {
	case version < 0 || version >= maxVersion:
		return Entry{}, fmt.Errorf("version %d: want 1 to 2^53, or 0 for the next one", version)
	case version == 0:
		version = declared
	case declared != 0 && declared != version:
		return Entry{}, fmt.Errorf("%s: %w: the file says version %d, the push %d", name, ErrVersionMismatch, declared, version)
	}
	return s.write(ctx, data, version, -1, 0)
}

func (s *SetStore) write(ctx context.Context, data []byte, version, expect, from int64) (Entry, error) {
	sha := SHA(data)
	res, err := pushScript.Run(ctx, s.rdb, []string{RuleSetKey, RuleSetHistoryKey},
		version, expect, data, sha, s.pusher, from, s.history, RuleSetChannel).Int64Slice()
	if err != nil {
		return Entry{}, fmt.Errorf("writing the rule set: %w", err)
	}
	if len(res) != 4 {
		return Entry{}, fmt.Errorf("writing the rule set: unexpected reply %v", res)
	}
	switch res[0] {
	case -1:
		return Entry{}, fmt.Errorf("%w: version %d pushed, %d in force", ErrStaleVersion, res[1], res[2])
	case -2:
		return Entry{}, fmt.Errorf("%w (version %d in force, expected %d)", ErrConflict, res[2], expect)
	}
	return Entry{Version: res[1], YAML: data, SHA: sha, PushedAt: time.UnixMilli(res[3]), Pusher: s.pusher, From: from}, nil
}

// Current returns the version in force, or ErrNoRuleSet.
func (s *SetStore) Current(ctx context.Context) (Entry, error) {
	v, err := s.rdb.HMGet(ctx, RuleSetKey, "version", "yaml", "sha", "at", "by", "from").Result()
	if err != nil {
		return Entry{}, fmt.Errorf("reading the rule set: %w", err)
	}
	if v[0] == nil {
		return Entry{}, ErrNoRuleSet
	}
	return entryOf(v[0], v[1], v[2], v[3], v[4], v[5])
}

// currentVersion returns the version in force and its SHA, cheaply: 0 and
// "" when there is none.
func (s *SetStore) currentVersion(ctx context.Context) (int64, string, error) {
	v, err := s.rdb.HMGet(ctx, RuleSetKey, "version", "sha").Result()
	if err != nil {
		return 0, "", fmt.Errorf("reading the rule set's version: %w", err)
	}
	if v[0] == nil {
		return 0, "", nil
	}
	n, err := strconv.ParseInt(str(v[0]), 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("the stored rule set's version %q is not a number", str(v[0]))
	}
	return n, str(v[1]), nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func entryOf(version, data, sha, at, by, from any) (Entry, error) {
	e := Entry{YAML: []byte(str(data)), SHA: str(sha), Pusher: str(by)}
	var err error
	if e.Version, err = strconv.ParseInt(str(version), 10, 64); err != nil {
		return Entry{}, fmt.Errorf("the stored rule set's version %q is not a number", str(version))
	}
	if ms, err := strconv.ParseInt(str(at), 10, 64); err == nil {
		e.PushedAt = time.UnixMilli(ms)
	}
	e.From, _ = strconv.ParseInt(str(from), 10, 64)
	return e, nil
}

// History returns the stored versions, newest first (the current one
// included), at most KeepHistory of them.
func (s *SetStore) History(ctx context.Context) ([]Entry, error) {
	m, err := s.rdb.HGetAll(ctx, RuleSetHistoryKey).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the rule set's history: %w", err)
	}
	var es []Entry
	for f, data := range m {
		if strings.Contains(f, ":") {
			continue
		}
		e, err := entryOf(f, data, m[f+":sha"], m[f+":at"], m[f+":by"], m[f+":from"])
		if err != nil {
			continue
		}
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b Entry) int { return -cmpInt(a.Version, b.Version) })
	return es, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Rollback restores the rule set that was in force before the current one,
// as a new, higher version (so that enforcers take it), in one atomic step.
// "Before" follows the content: rolling back a rollback goes one version
// further back, as an undo does. It returns the new entry, whose From is the
// version restored. Errors: ErrNoRuleSet, ErrNoPrevious when the history
// holds no earlier version, ErrConflict when a push raced it, and the
// restored file's parse error if it no longer parses.
func (s *SetStore) Rollback(ctx context.Context) (Entry, error) {
	return s.rollback(ctx, 0)
}

// RollbackTo restores version v from the history as a new version; see
// Rollback.
func (s *SetStore) RollbackTo(ctx context.Context, v int64) (Entry, error) {
	if v <= 0 {
		return Entry{}, fmt.Errorf("version %d: want a version from the history", v)
	}
	return s.rollback(ctx, v)
}

func (s *SetStore) rollback(ctx context.Context, to int64) (Entry, error) {
	cur, err := s.Current(ctx)
	if err != nil {
		return Entry{}, err
	}
	hist, err := s.History(ctx)
	if err != nil {
		return Entry{}, err
	}
	var target *Entry
	for i := range hist { // newest first
		h := &hist[i]
		if (to == 0 && h.Version < cur.Source()) || (to != 0 && h.Version == to) {
			target = h
			break
		}
	}
	if target == nil {
		if to != 0 {
			return Entry{}, fmt.Errorf("%w: version %d is not in the history (it keeps the last %d)", ErrNoPrevious, to, s.history)
		}
		return Entry{}, fmt.Errorf("%w: version %d restores version %d, and the history holds nothing older", ErrNoPrevious, cur.Version, cur.Source())
	}
	if _, err := Parse("redis:v"+strconv.FormatInt(target.Version, 10), target.YAML); err != nil {
		return Entry{}, fmt.Errorf("version %d no longer parses: %w", target.Version, err)
	}
	return s.write(ctx, bytes.Clone(target.YAML), cur.Version+1, cur.Version, target.Source())
}
