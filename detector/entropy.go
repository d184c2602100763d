package detector

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// EntropyOptions configure the entropy signals. Zero fields take the
// defaults named on each.
type EntropyOptions struct {
	// Window is the event-time window. Default 10 s.
	Window time.Duration
	// K is how many client addresses are tracked per window. Default 64.
	K int
	// MinRequests is the least a client sends in a window to be judged.
	// Default 50.
	MinRequests uint64
	// ScanEntropy and ScanNotFound: a client whose normalised path entropy
	// is at least ScanEntropy, with at least that many distinct paths as a
	// fraction of its requests, and at least ScanNotFound of its responses
	// 404, is scanning random URIs. Defaults 0.9 and 0.5.
	ScanEntropy, ScanNotFound float64
	// SwitchEntropy and SwitchUAs: a client whose normalised user-agent
	// entropy is at least SwitchEntropy over at least SwitchUAs distinct
	// user agents, while it shows at most two JA4s (one TLS stack, so one
	// client, not the many users behind a carrier-grade NAT), is switching
	// user agents. Defaults 0.8 and 10.
	SwitchEntropy float64
	SwitchUAs     uint64
	// TTL of an emitted rule; a client is not emitted again while its rule
	// has more than half of it left. Default 10 min.
	TTL time.Duration
	// Limit of an emitted rule, requests per Window. Default 10.
	Limit int64
	// Enforce emits rules in enforce mode; default shadow.
	Enforce bool
	// LongWindows and NoLongWindows: the further time scales, as
	// HeavyHitterOptions' (default 1 min and 10 min), each scale's
	// MinRequests scaled by ScaleFloor.
	LongWindows   []time.Duration
	NoLongWindows bool
}

func (o *EntropyOptions) defaults() error {
	orDefault(&o.Window, 10*time.Second)
	orDefault(&o.K, 64)
	orDefault(&o.MinRequests, 50)
	orDefault(&o.ScanEntropy, 0.9)
	orDefault(&o.ScanNotFound, 0.5)
	orDefault(&o.SwitchEntropy, 0.8)
	orDefault(&o.SwitchUAs, 10)
	orDefault(&o.TTL, 10*time.Minute)
	orDefault(&o.Limit, 10)
	c := optCheck{signal: "entropy"}
	c.window(o.Window)
	c.ttl(o.TTL, o.Window)
	c.count("K", o.K, MaxK)
	c.fraction("ScanEntropy", o.ScanEntropy)
	c.fraction("ScanNotFound", o.ScanNotFound)
	c.fraction("SwitchEntropy", o.SwitchEntropy)
	c.limit("Limit", o.Limit)
	c.longWindows(o.LongWindows)
	return c.err()
}

// Entropy flags clients by the shape of their traffic rather than its
// volume: a random-URI scan (paths that hardly repeat, mostly answered 404)
// and a user-agent switching flood (a new user agent on almost every
// request from one TLS stack). Per window it tracks the heaviest client
// addresses with a Space-Saving top-k and, for each, the empirical entropy
// of its paths, user agents and JA4s (sketch.Entropy: H = ln N - S/N,
// normalised by ln of the distinct count) and its 404 count.
//
// Entropy is a stage.Stage and Checkpointer, not safe for concurrent
// use. Build it with NewEntropy.
type Entropy struct {
	o      EntropyOptions
	name   string
	active coolDown // client -> expiry of its rule, shared by the scales
	// exempt, when set, leaves records out (verified crawlers).
	exempt func(*decisionpb.Decision) bool
}

// NewEntropy returns the signals with o's zero fields defaulted, or an
// error wrapping ErrBadOptions.
func NewEntropy(o EntropyOptions) (*Entropy, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	return &Entropy{o: o, name: "entropy", active: coolDown{}}, nil
}

// NewEntropyScales returns the signals at each of o's time scales
// (o.Window, then each long window, with MinRequests scaled by ScaleFloor
// and the TTL at least the window), sharing one cool-down: the stage at
// o.Window is named entropy, the others entropy-<window>. It errors as
// NewEntropy.
func NewEntropyScales(o EntropyOptions) ([]*Entropy, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	active := coolDown{}
	out := []*Entropy{{o: o, name: "entropy", active: active}}
	for _, w := range longWindows(o.Window, o.LongWindows, o.NoLongWindows) {
		x := o
		x.Window, x.TTL = w, max(o.TTL, w)
		x.MinRequests = uint64(ScaleFloor(float64(o.MinRequests), o.Window, w))
		out = append(out, &Entropy{o: x, name: "entropy-" + w.String(), active: active})
	}
	return out, nil
}

// Name is the stage's name in the pipeline.
func (e *Entropy) Name() string { return e.name }

// Window is the event-time window the signals count in.
func (e *Entropy) Window() time.Duration { return e.o.Window }

// clientShape is one client's traffic shape in a window.
type clientShape struct {
	paths, uas, ja4s *sketch.Entropy
	notFound         uint64
}

func newShape() *clientShape {
	return &clientShape{paths: sketch.NewEntropy(16, 6), uas: sketch.NewEntropy(16, 6), ja4s: sketch.NewEntropy(4, 4)}
}

type entropyPartial struct {
	exempt  func(*decisionpb.Decision) bool
	k       int
	clients *sketch.TopK
	shapes  map[string]*clientShape // for clients the top-k tracks (and a few it has just dropped)
}

// NewPartial returns an empty window state.
func (e *Entropy) NewPartial() stage.Partial {
	return &entropyPartial{exempt: e.exempt, k: e.o.K, clients: sketch.NewTopK(e.o.K), shapes: map[string]*clientShape{}}
}

// Observe counts one record.
func (p *entropyPartial) Observe(d *decisionpb.Decision) {
	x := d.GetDescriptors()
	ip := x.GetClientIp()
	if ip == "" || (p.exempt != nil && p.exempt(d)) {
		return
	}
	h := sketch.Hash64(ip)
	p.clients.AddHash(h, ip, 1)
	if !p.clients.Tracked(h, ip) {
		return
	}
	sh := p.shapes[ip]
	if sh == nil {
		if len(p.shapes) >= 2*p.k {
			p.prune()
		}
		sh = newShape()
		p.shapes[ip] = sh
	}
	path, _, _ := strings.Cut(x.GetPath(), "?")
	sh.paths.Update(path, 1)
	sh.uas.Update(d.GetUserAgent(), 1)
	sh.ja4s.Update(x.GetJa4(), 1)
	if d.GetStatus() == 404 && !IsAsset(path) {
		sh.notFound++ // a page's missing image is not a scan
	}
}

// prune drops the shapes of clients the top-k no longer tracks.
func (p *entropyPartial) prune() {
	for ip := range p.shapes {
		if !p.clients.Tracked(sketch.Hash64(ip), ip) {
			delete(p.shapes, ip)
		}
	}
}

// Merge folds in another partition's state of the same window.
func (p *entropyPartial) Merge(o stage.Partial) error {
	x, ok := o.(*entropyPartial)
	if !ok {
		return fmt.Errorf("detector: entropy cannot merge a %T", o)
	}
	p.clients.Merge(x.clients)
	for _, ip := range slices.Sorted(maps.Keys(x.shapes)) {
		xs := x.shapes[ip]
		sh := p.shapes[ip]
		if sh == nil {
			p.shapes[ip] = xs
			continue
		}
		for _, pair := range [][2]*sketch.Entropy{{sh.paths, xs.paths}, {sh.uas, xs.uas}, {sh.ja4s, xs.ja4s}} {
			if err := pair[0].Merge(pair[1]); err != nil {
				return err
			}
		}
		sh.notFound += xs.notFound
	}
	p.prune()
	return nil
}

// MarshalBinary encodes the state: the top-k, then each tracked client's
// shape sorted by client.
func (p *entropyPartial) MarshalBinary() ([]byte, error) {
	p.prune()
	top, err := p.clients.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b := binary.AppendUvarint(nil, uint64(p.k))
	b = stage.AppendBytes(b, top)
	b = binary.AppendUvarint(b, uint64(len(p.shapes)))
	for _, ip := range slices.Sorted(maps.Keys(p.shapes)) {
		sh := p.shapes[ip]
		b = stage.AppendString(b, ip)
		for _, e := range []*sketch.Entropy{sh.paths, sh.uas, sh.ja4s} {
			x, err := e.MarshalBinary()
			if err != nil {
				return nil, err
			}
			b = stage.AppendBytes(b, x)
		}
		b = binary.AppendUvarint(b, sh.notFound)
	}
	return b, nil
}

// DecodePartial decodes what a partial's MarshalBinary wrote.
func (e *Entropy) DecodePartial(b []byte) (stage.Partial, error) {
	r := stage.NewStateReader(b)
	k := r.Uvarint()
	top := r.Bytes()
	p := &entropyPartial{exempt: e.exempt, k: int(min(k, 1<<20)), clients: new(sketch.TopK), shapes: map[string]*clientShape{}}
	for range r.Count(4) {
		ip := r.String()
		sh := &clientShape{paths: new(sketch.Entropy), uas: new(sketch.Entropy), ja4s: new(sketch.Entropy)}
		for _, x := range []*sketch.Entropy{sh.paths, sh.uas, sh.ja4s} {
			if err := x.UnmarshalBinary(r.Bytes()); err != nil {
				return nil, fmt.Errorf("detector: entropy of client %.64q: %w", ip, err)
			}
		}
		sh.notFound = r.Uvarint()
		p.shapes[ip] = sh
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("detector: entropy window state: %w", err)
	}
	if err := p.clients.UnmarshalBinary(top); err != nil {
		return nil, fmt.Errorf("detector: entropy clients: %w", err)
	}
	if k == 0 || int(k) != p.clients.K() {
		return nil, fmt.Errorf("detector: entropy window state of %d clients with a top-k of %d", k, p.clients.K())
	}
	return p, nil
}

// Finish judges a window's tracked clients and returns the rules of those
// scanning or switching user agents.
func (e *Entropy) Finish(w stage.Window, merged stage.Partial) stage.Output {
	p, ok := merged.(*entropyPartial)
	if !ok {
		return stage.Output{}
	}
	var out stage.Output
	for _, it := range p.clients.List() {
		sh := p.shapes[it.Key]
		n := it.Count - it.Err
		if sh == nil || n < e.o.MinRequests {
			continue
		}
		signal, why := e.judge(sh)
		if signal == "" {
			continue
		}
		if e.active.fresh(it.Key, w.End, e.o.TTL) {
			continue
		}
		r := dynamicRule(w, e.o.TTL, e.o.Enforce, rules.Rule{
			ID:     "dyn-en-" + strconv.FormatUint(sketch.Hash64(signal+"|"+it.Key), 16),
			Match:  []rules.Match{{Key: rules.KeyClientIP, Value: it.Key}},
			Limit:  e.o.Limit,
			Period: e.o.Window,
			Origin: "detector/" + signal,
			Reason: fmt.Sprintf("client_ip %s sent %d requests in the %s window from %s: %s", it.Key, it.Count, e.o.Window, w.Start.UTC().Format(time.RFC3339), why),
			Evidence: map[string]string{
				"signal":          signal,
				"count":           strconv.FormatUint(it.Count, 10),
				"count_error":     strconv.FormatUint(it.Err, 10),
				"path_entropy":    fmtEntropy(sh.paths),
				"paths":           strconv.FormatUint(sh.paths.Distinct(), 10),
				"ua_entropy":      fmtEntropy(sh.uas),
				"user_agents":     strconv.FormatUint(sh.uas.Distinct(), 10),
				"ja4s":            strconv.FormatUint(sh.ja4s.Distinct(), 10),
				"not_found_share": strconv.FormatFloat(float64(sh.notFound)/float64(max(1, sh.paths.Total())), 'f', 3, 64),
			},
		})
		e.active[it.Key] = r.ExpiresAt
		out.Rules = append(out.Rules, r)
	}
	e.active.expire(w.End)
	return out
}

// judge names the signal a client's shape raises, if any, and why.
func (e *Entropy) judge(sh *clientShape) (signal, why string) {
	n := float64(max(1, sh.paths.Total()))
	paths, notFound := float64(sh.paths.Distinct()), float64(sh.notFound)/n
	if sh.paths.Normalized() >= e.o.ScanEntropy && paths >= e.o.ScanEntropy*n && notFound >= e.o.ScanNotFound {
		return "random-uri-scan", fmt.Sprintf("%.0f distinct paths (normalised entropy %.2f), %.0f%% answered 404", paths, sh.paths.Normalized(), 100*notFound)
	}
	if uas := sh.uas.Distinct(); uas >= e.o.SwitchUAs && sh.uas.Normalized() >= e.o.SwitchEntropy && sh.ja4s.Distinct() <= 2 {
		return "ua-switching", fmt.Sprintf("%d user agents (normalised entropy %.2f) over %d TLS fingerprint(s)", uas, sh.uas.Normalized(), sh.ja4s.Distinct())
	}
	return "", ""
}

func fmtEntropy(e *sketch.Entropy) string {
	h := e.Normalized()
	if math.IsNaN(h) {
		h = 0
	}
	return strconv.FormatFloat(h, 'f', 3, 64)
}

// MarshalState encodes the clients whose rules are fresh (cool-down).
func (e *Entropy) MarshalState() ([]byte, error) { return e.active.appendTo(nil), nil }

// UnmarshalState restores what MarshalState wrote.
func (e *Entropy) UnmarshalState(b []byte) error {
	c, err := decodeCoolDown(b, "entropy")
	if err != nil {
		return err
	}
	e.active.merge(c) // the map the scales share
	return nil
}
