package store

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/rules"
	"go.yaml.in/yaml/v3"
)

// Timing and bounds of the rule-set store (its keys are in keys.go).
const (
	// EnforcerStale is how long an enforcer may go without reporting before
	// `sluice rules list` shows it as stale.
	EnforcerStale = time.Minute
	// EnforcerForget is how long an enforcer may go without reporting before
	// its entry is ignored when a push picks or checks a version, and
	// deleted (by pushes and by the other enforcers' polls).
	EnforcerForget = 10 * time.Minute
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
	// ErrUnchanged: the content pushed (or rolled back to) is the content in
	// force, byte for byte: nothing was written, no version made.
	ErrUnchanged = errors.New("the content is already in force: nothing written")
	// ErrEnforcerAhead: an enforcer reports holding a version above the one
	// pushed (or that version with other content): typically the store lost
	// its data and holds less than the enforcers. Nothing was written; push
	// without a version (the next one is then above every enforcer's) or
	// with a higher one.
	ErrEnforcerAhead = errors.New("an enforcer holds a newer rule set than the one pushed")
	// ErrOutcomeUnknown: Redis did not answer a write in time, or the
	// connection broke while it was in flight: the write may or may not
	// have happened. Read the store (Current) to know.
	ErrOutcomeUnknown = errors.New("no answer from Redis: the write may or may not have happened")
	// ErrNotInHistory: the version asked for is not (or no longer) in the
	// history.
	ErrNotInHistory = errors.New("that version is not in the history")
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
	// Replaced is, in the entry Push or a rollback returns, the version
	// that was in force just before it (0: none); it is not stored.
	Replaced int64

	set *rules.Set // parsed by Push, for Set
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
func (e *Entry) Set() (*rules.Set, error) {
	if e.set != nil {
		return e.set, nil
	}
	name := "redis:v" + strconv.FormatInt(e.Version, 10)
	s, err := rules.Parse(name, e.YAML)
	if err != nil {
		return nil, err
	}
	if d, err := declaredVersion(s, e.YAML); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	} else if d != 0 && d != e.Version && d != e.Source() {
		return nil, fmt.Errorf("%s: %w: the file says version %d", name, ErrVersionMismatch, d)
	}
	s.Version = e.Version
	return s, nil
}

// declaredVersion is DeclaredVersion of data that Parse read as s, without
// a second YAML parse when it can (a rule file of 8 MB takes half a second to
// parse): Parse gives the declared version, or 1 when there is none, so
// only a version of 1 needs DeclaredVersion (itself quick for a file
// without the word "version").
func declaredVersion(s *rules.Set, data []byte) (int64, error) {
	switch {
	case s.Version < 1 || s.Version >= maxVersion:
		return 0, fmt.Errorf("version %d: want a whole number from 1 to 2^53", s.Version)
	case s.Version != 1:
		return s.Version, nil
	}
	return DeclaredVersion(data)
}

// DeclaredVersion returns the top-level `version:` of a rule file, or 0 when
// it has none. It reads only that field; Parse checks the rest.
func DeclaredVersion(data []byte) (int64, error) {
	if !bytes.Contains(data, []byte("version")) && !bytes.ContainsRune(data, '\\') {
		return 0, nil // no such key, even escaped: spare the parse (half a second for 8 MB)
	}
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

// Client returns the Redis client the store uses.
func (s *SetStore) Client() redis.UniversalClient { return s.rdb }

// NewSetStore returns a SetStore over rdb.
func NewSetStore(rdb redis.UniversalClient, opts ...SetStoreOption) *SetStore {
	s := &SetStore{rdb: rdb, history: DefaultHistory}
	for _, o := range opts {
		o(s)
	}
	return s
}

// pushScript writes a version. It refuses, in this order: a write that
// expected another version in force (expect >= 0), content identical to the
// set in force, a version at or below the one in force, and a version below
// one an enforcer reports holding (or equal to it, with other content).
// Version 0 is the next one above both the store's and every enforcer's.
// Then it publishes the version, writes the set and its history entry, drops
// the oldest history entries beyond keep, and forgets enforcers not heard
// from for forget ms. It publishes before it writes anything: Redis does not
// undo a script's writes when a later command fails, and a user that may not
// PUBLISH (an ACL user without +publish) would otherwise leave the set
// written under an error that says the push failed. Subscribers read the set
// after the script has run (a script is atomic), so they never see the
// version before its set.
//
//	KEYS: RuleSetKey, RuleSetHistoryKey, RuleSetEnforcersKey
//	ARGV: version (0: the next), expect (-1: any), yaml, sha, by, from, keep, channel, forget (ms)
//	returns {status, version, previous, at ms, [instance, its version, ms since its report]}:
//	status 1 written, -1 stale, -2 conflict, -3 an enforcer is ahead, -4 unchanged
var pushScript = redis.NewScript(`
local st = redis.call('HMGET', KEYS[1], 'version', 'sha')
local cur = tonumber(st[1] or '0') or 0
local expect = tonumber(ARGV[2])
if expect >= 0 and cur ~= expect then return {-2, cur, cur, 0} end
if cur > 0 and st[2] == ARGV[4] and (tonumber(ARGV[1]) == 0 or expect >= 0) then return {-4, cur, cur, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = tonumber(ARGV[1])
local top, ahead, forget = 0, nil, {}
local es = redis.call('HGETALL', KEYS[3])
for i = 1, #es, 2 do
  local ev, esha, eat = string.match(es[i + 1], '^(%d+) (%x*) (%d+)$')
  ev, eat = tonumber(ev), tonumber(eat)
  if ev == nil or now - eat > tonumber(ARGV[9]) then
    forget[#forget + 1] = es[i]
  else
    if ev > top then top = ev end
    if v > 0 and ahead == nil and (ev > v or (ev == v and esha ~= ARGV[4])) then ahead = {es[i], ev, now - eat} end
  end
end
if v == 0 then
  v = math.max(cur, top) + 1
elseif v <= cur then
  return {-1, v, cur, 0}
elseif ahead then
  return {-3, v, cur, 0, ahead[1], ahead[2], ahead[3]}
end
local at = string.format('%d', now)
local vs = string.format('%d', v)
redis.call('PUBLISH', ARGV[8], vs)
for _, f in ipairs(forget) do redis.call('HDEL', KEYS[3], f) end
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
return {1, v, cur, now}
`)

// Push validates data as a rule file (Parse; name is used in its errors,
// which give name:line:column) and stores it as the version in force, in one
// atomic step that also records it in the history and publishes its version
// on RuleSetChannel. The returned entry's Replaced is the version it
// replaced, and its Set is the parsed set.
//
// version 0 means the YAML's own top-level version: if it declares one, else
// the next version: one above both the version in force and every version
// an enforcer reports holding (RuleSetEnforcersKey), so that a store that
// lost its data does not start again below its enforcers. Errors:
//   - ErrStaleVersion: a version at or below the one in force;
//   - ErrEnforcerAhead: a version below one that an enforcer heard from in
//     the last EnforcerForget holds, or equal to it with other content (the
//     same content is accepted: it restores the store to what the enforcers
//     hold);
//   - ErrVersionMismatch: a version that differs from the YAML's declared one;
//   - ErrUnchanged: content identical to the set in force (nothing written);
//   - ErrOutcomeUnknown: Redis did not answer in time (see its doc).
//
// Versions are at most 2^53.
func (s *SetStore) Push(ctx context.Context, name string, data []byte, version int64) (Entry, error) {
	set, err := rules.Parse(name, data)
	if err != nil {
		return Entry{}, err
	}
	declared, err := declaredVersion(set, data)
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
	e, err := s.write(ctx, data, version, -1, 0)
	if err == nil {
		set.Version = e.Version
		e.set = set
	}
	return e, err
}

func (s *SetStore) write(ctx context.Context, data []byte, version, expect, from int64) (Entry, error) {
	sha := SHA(data)
	reply, err := pushScript.Run(ctx, s.rdb, []string{RuleSetKey, RuleSetHistoryKey, RuleSetEnforcersKey},
		version, expect, data, sha, s.pusher, from, s.history, RuleSetChannel, EnforcerForget.Milliseconds()).Slice()
	if err != nil {
		if outcomeUnknown(err) {
			return Entry{}, fmt.Errorf("writing the rule set: %w (%v)", ErrOutcomeUnknown, err)
		}
		return Entry{}, fmt.Errorf("writing the rule set: %w", err)
	}
	res := make([]int64, len(reply))
	for i, x := range reply {
		res[i], _ = x.(int64)
	}
	if len(res) < 4 {
		return Entry{}, fmt.Errorf("writing the rule set: unexpected reply %v", reply)
	}
	switch res[0] {
	case -1:
		return Entry{}, fmt.Errorf("%w: version %d pushed, %d in force", ErrStaleVersion, res[1], res[2])
	case -2:
		return Entry{}, fmt.Errorf("%w (version %d in force, expected %d)", ErrConflict, res[2], expect)
	case -3:
		var who string
		if len(reply) == 7 {
			who, _ = reply[4].(string)
		}
		return Entry{}, fmt.Errorf("%w: version %d pushed, but enforcer %q reported holding version %d %s ago (the store holds %d; did Redis lose its data?): push without a version, or with one above %d",
			ErrEnforcerAhead, res[1], who, res[5], (time.Duration(res[6]) * time.Millisecond).Round(time.Second), res[2], res[5])
	case -4:
		return Entry{Version: res[1], SHA: sha, Replaced: res[1]}, fmt.Errorf("%w: version %d has this content", ErrUnchanged, res[1])
	}
	return Entry{Version: res[1], YAML: data, SHA: sha, PushedAt: time.UnixMilli(res[3]), Pusher: s.pusher, From: from, Replaced: res[2]}, nil
}

// outcomeUnknown reports whether err leaves a write's outcome unknown: not
// Redis's refusal, nor a connection that was never made, but a timeout or a
// connection lost while the write was in flight.
func outcomeUnknown(err error) bool {
	var re redis.Error
	if errors.As(err, &re) {
		return false // Redis answered
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return !errors.Is(err, redis.ErrClosed) && !errors.Is(err, redis.ErrPoolTimeout)
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
	return versionOf(v)
}

func versionOf(v []any) (int64, string, error) {
	if len(v) != 2 || v[0] == nil {
		return 0, "", nil
	}
	n, err := strconv.ParseInt(str(v[0]), 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("the stored rule set's version %q is not a number", str(v[0]))
	}
	return n, str(v[1]), nil
}

// pollScript records what an enforcer holds in RuleSetEnforcersKey (at
// Redis's time), forgets one other enforcer picked at random if it has not
// reported for forget ms (so that the hash stays bounded by the enforcers
// heard from lately, whoever pushes or not), and returns the version in
// force and its SHA, as currentVersion does.
//
//	KEYS: RuleSetKey, RuleSetEnforcersKey
//	ARGV: instance, version, sha, forget (ms)
var pollScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. string.format('%d', now))
local ok, r = pcall(redis.call, 'HRANDFIELD', KEYS[2], 1, 'WITHVALUES')
if ok and r[2] then
  local at = tonumber(string.match(r[2], ' (%d+)$'))
  if at == nil or now - at > tonumber(ARGV[4]) then redis.call('HDEL', KEYS[2], r[1]) end
end
return redis.call('HMGET', KEYS[1], 'version', 'sha')
`)

// poll reports that instance holds version (with content sha) and returns
// the version in force and its SHA, as currentVersion, in one round trip.
func (s *SetStore) poll(ctx context.Context, instance string, version int64, sha string) (int64, string, error) {
	v, err := pollScript.Run(ctx, s.rdb, []string{RuleSetKey, RuleSetEnforcersKey},
		instance, version, sha, EnforcerForget.Milliseconds()).Slice()
	if err != nil {
		return 0, "", fmt.Errorf("reading the rule set's version: %w", err)
	}
	return versionOf(v)
}

// EnforcerReport is what one enforcer following the store last reported
// holding (see RuleSetEnforcersKey).
type EnforcerReport struct {
	Instance string
	// Version and SHA are the rule set it holds: version 0 and SHA "" for
	// none from the store yet.
	Version int64
	SHA     string
	// At is when it reported, on Redis's clock; Age how long before the read
	// (also on Redis's clock).
	At  time.Time
	Age time.Duration
}

// Stale reports whether the enforcer has not reported for EnforcerStale: it
// stopped, or cannot reach Redis.
func (r *EnforcerReport) Stale() bool { return r.Age > EnforcerStale }

// enforcersScript returns Redis's time (ms) and RuleSetEnforcersKey's
// fields and values.
var enforcersScript = redis.NewScript(`
local t = redis.call('TIME')
return {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), redis.call('HGETALL', KEYS[1])}
`)

// Enforcers returns what each enforcer following the store reported last,
// by instance name, except those not heard from for EnforcerForget (which
// the next push or poll deletes). An entry that does not decode is left out.
func (s *SetStore) Enforcers(ctx context.Context) ([]EnforcerReport, error) {
	v, err := enforcersScript.Run(ctx, s.rdb, []string{RuleSetEnforcersKey}).Slice()
	if err != nil {
		return nil, fmt.Errorf("reading the enforcers' reports: %w", err)
	}
	if len(v) != 2 {
		return nil, fmt.Errorf("reading the enforcers' reports: unexpected reply %v", v)
	}
	now, _ := v[0].(int64)
	kv, _ := v[1].([]any)
	var rs []EnforcerReport
	for i := 0; i+1 < len(kv); i += 2 {
		f := strings.Fields(str(kv[i+1]))
		if len(f) == 2 { // no SHA
			f = []string{f[0], "", f[1]}
		}
		if len(f) != 3 {
			continue
		}
		ver, err1 := strconv.ParseInt(f[0], 10, 64)
		at, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || now-at > EnforcerForget.Milliseconds() {
			continue
		}
		rs = append(rs, EnforcerReport{Instance: str(kv[i]), Version: ver, SHA: f[1],
			At: time.UnixMilli(at), Age: time.Duration(now-at) * time.Millisecond})
	}
	slices.SortFunc(rs, func(a, b EnforcerReport) int { return strings.Compare(a.Instance, b.Instance) })
	return rs, nil
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
// included), at most KeepHistory of them, without their YAML (a version may
// be megabytes): Get reads one whole.
func (s *SetStore) History(ctx context.Context) ([]Entry, error) {
	fs, err := s.rdb.HKeys(ctx, RuleSetHistoryKey).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the rule set's history: %w", err)
	}
	var vs []string
	for _, f := range fs {
		if !strings.Contains(f, ":") {
			vs = append(vs, f)
		}
	}
	if len(vs) == 0 {
		return nil, nil
	}
	meta := make([]string, 0, 4*len(vs))
	for _, v := range vs {
		meta = append(meta, v+":sha", v+":at", v+":by", v+":from")
	}
	m, err := s.rdb.HMGet(ctx, RuleSetHistoryKey, meta...).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the rule set's history: %w", err)
	}
	es := make([]Entry, 0, len(vs))
	for i, v := range vs {
		e, err := entryOf(v, nil, m[4*i], m[4*i+1], m[4*i+2], m[4*i+3])
		if err != nil {
			continue
		}
		e.YAML = nil
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b Entry) int { return -cmp.Compare(a.Version, b.Version) })
	return es, nil
}

// Get returns version v from the history, YAML included, or an error
// wrapping ErrNotInHistory.
func (s *SetStore) Get(ctx context.Context, v int64) (Entry, error) {
	f := strconv.FormatInt(v, 10)
	m, err := s.rdb.HMGet(ctx, RuleSetHistoryKey, f, f+":sha", f+":at", f+":by", f+":from").Result()
	if err != nil {
		return Entry{}, fmt.Errorf("reading version %d from the history: %w", v, err)
	}
	if m[0] == nil {
		return Entry{}, fmt.Errorf("%w: version %d (it keeps the last %d)", ErrNotInHistory, v, s.history)
	}
	return entryOf(f, m[0], m[1], m[2], m[3], m[4])
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
		// Without --to: the newest version before the one whose content is in
		// force, with other content (a push of the same content twice, which
		// Push now refuses, is not a step back).
		if (to == 0 && h.Version < cur.Source() && h.SHA != cur.SHA) || (to != 0 && h.Version == to) {
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
	if target.SHA == cur.SHA {
		return Entry{Version: cur.Version, SHA: cur.SHA, Replaced: cur.Version, From: target.Version},
			fmt.Errorf("%w: version %d has version %d's content", ErrUnchanged, cur.Version, target.Version)
	}
	t, err := s.Get(ctx, target.Version)
	if err != nil {
		return Entry{}, err
	}
	set, err := rules.Parse("redis:v"+strconv.FormatInt(t.Version, 10), t.YAML)
	if err != nil {
		return Entry{}, fmt.Errorf("version %d no longer parses: %w", t.Version, err)
	}
	e, err := s.write(ctx, bytes.Clone(t.YAML), cur.Version+1, cur.Version, t.Source())
	if err == nil {
		set.Version = e.Version
		e.set = set
	}
	return e, err
}
