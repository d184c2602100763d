package detector

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// HeavyHitterOptions configure the heavy-hitter signal. Zero fields take the
// defaults named on each.
type HeavyHitterOptions struct {
	// Window is the event-time window the signal counts in. Default 10 s,
	// so that a client is flagged within two windows of starting.
	Window time.Duration
	// Factor: a client is heavy when its count in a window exceeds Factor
	// times the baseline count per client. Default 20.
	Factor float64
	// MinCount is the least count in one window that can be heavy, whatever
	// the baseline. Default 30.
	MinCount uint64
	// LimitFactor sets the dynamic rule's limit: LimitFactor times the
	// baseline count per client per Window, at least MinLimit. Defaults 4, 10.
	LimitFactor float64
	MinLimit    int64
	// K is how many clients the top-k sketch tracks per window. Default 64.
	K int
	// TTL of an emitted rule; the same scope is not re-emitted while its rule
	// has more than half of it left (cool-down). Default 10 min.
	TTL time.Duration
	// SharedDevices: an address with at least this many distinct devices
	// (JA4 and user-agent pairs) in a window is a shared one (carrier-grade
	// NAT, a corporate proxy) and is flagged only if its requests per device
	// are heavy. Default 20.
	SharedDevices uint64
	// Enforce emits rules in enforce mode. Default false: shadow mode, so a
	// new rule only reports what it would deny until someone promotes it.
	Enforce bool
	// LongWindows are the further time scales Signals runs the signal at,
	// each a stage of its own sharing one cool-down, so that a client too
	// slow to stand out in 10 s stands out over a minute or ten. Default
	// 1 min and 10 min; windows not longer than Window are dropped; set
	// NoLongWindows for Window alone. Each scale's MinCount is MinCount
	// scaled by ScaleFloor.
	LongWindows   []time.Duration
	NoLongWindows bool
	// AssetWeight is what a page's subresource counts for in a client's
	// count (an image, a style sheet, a script, a font: IsAsset) fetched
	// successfully (2xx, 304, or no status): a browser loading one page
	// fetches a document and dozens of assets within a second or two, one
	// burst a person makes on every page, where a scraper asks for
	// documents. Default 0.1: a page with 100 assets counts 11, under
	// MinCount; a client fetching only assets is judged on a tenth of
	// them, so an image scraper at 10 a second is flagged over 10 min.
	AssetWeight float64
	// Persist is how many windows in a row a client must be heavy in to be
	// flagged. Default 1 at Window, and 2 at each long window: over a
	// minute, one window of a person loading pages with many images each
	// can pass the floor; a scraper keeps it up. A window counts as in a
	// row only when it starts where the last judged one ended.
	Persist int
}

func (o *HeavyHitterOptions) defaults() error {
	orDefault(&o.Window, 10*time.Second)
	orDefault(&o.Factor, 20)
	orDefault(&o.MinCount, 30)
	orDefault(&o.LimitFactor, 4)
	orDefault(&o.MinLimit, 10)
	orDefault(&o.K, 64)
	orDefault(&o.TTL, 10*time.Minute)
	orDefault(&o.SharedDevices, 20)
	orDefault(&o.Persist, 1)
	orDefault(&o.AssetWeight, 0.1)
	c := optCheck{signal: "heavy hitters"}
	c.window(o.Window)
	c.ttl(o.TTL, o.Window)
	c.count("K", o.K, MaxK)
	c.positive("Factor", o.Factor)
	c.positive("LimitFactor", o.LimitFactor)
	c.limit("MinLimit", o.MinLimit)
	c.longWindows(o.LongWindows)
	c.count("Persist", o.Persist, MaxBaseline)
	c.fraction("AssetWeight", o.AssetWeight)
	return c.err()
}

// scales returns o at each of its time scales: o itself first, then o at
// each long window (defaults filled in), with MinCount scaled by ScaleFloor
// and the TTL at least the window.
func (o HeavyHitterOptions) scales() []HeavyHitterOptions {
	out := []HeavyHitterOptions{o}
	for _, w := range longWindows(o.Window, o.LongWindows, o.NoLongWindows) {
		x := o
		x.Window, x.TTL = w, max(o.TTL, w)
		x.MinCount = uint64(ScaleFloor(float64(o.MinCount), o.Window, w))
		x.Persist = max(o.Persist, 2)
		out = append(out, x)
	}
	return out
}

// HeavyHitters flags clients (by client IP) whose request count in an
// event-time window is far above the baseline count per client, and turns
// each into a dynamic rule scoped to that client.
//
// Per window it keeps a Space-Saving top-k of client IPs (Metwally et al.
// 2005) and a HyperLogLog of distinct client IPs (Flajolet et al. 2007). At
// window close the baseline is the median, over the last baselineWindows
// windows that had traffic, of requests per distinct client with the
// flagged clients left out; before 3 windows are known the current window's
// own figure stands in. A median cannot be taught by an attack that lasts
// less than half its history (an EWMA could: a lone scraper on a sparse
// site that was not flagged in its first window raised the bar for the
// next). A client is flagged when its guaranteed count (Count-Err of the
// top-k) exceeds max(MinCount, Factor x baseline). Memory is O(K) per open
// window plus one 16 KiB HyperLogLog; it does not grow with the number of
// clients.
//
// HeavyHitters is a stage.Stage and Checkpointer: an I/O-free state machine, not safe for
// concurrent use. Its zero value is not usable: build it with NewHeavyHitters.
type HeavyHitters struct {
	o        HeavyHitterOptions
	name     string
	baseline *sketch.MAD
	active   coolDown // client IP -> expiry of its rule, shared by the scales
	// streaks are the clients heavy in the last judged window, which
	// ended at lastEnd, and for how many windows in a row (Persist).
	streaks map[string]int
	lastEnd time.Time
	// exempt, when set, leaves records out (verified crawlers).
	exempt func(*decisionpb.Decision) bool
}

// baselineWindows is how many windows with traffic the heavy-hitter
// baseline keeps (an hour of 10 s windows, 2.5 days of 10 min ones).
const baselineWindows = 360

func newHHBaseline() *sketch.MAD { return sketch.NewMAD(baselineWindows, 3) }

// hhPartial is one window's state on one partition: a top-k of client IPs,
// a HyperLogLog of them, the request count, and the distinct devices (JA4
// and user agent) of each address.
type hhPartial struct {
	exempt  func(*decisionpb.Decision) bool
	top     *sketch.TopK
	ips     *sketch.Distinct
	devices *sketch.Spread
	assets  *sketch.CountMin // successful asset fetches per client
	n       uint64
}

// newAssetCounts returns the count-min of asset fetches per client: an
// overestimate of at most 0.5% of the window's asset fetches with
// probability 0.99 (Cormode and Muthukrishnan 2005), which errs towards
// judging a client on fewer requests.
func newAssetCounts() *sketch.CountMin {
	cm, err := sketch.NewCountMin(0.005, 0.01)
	if err != nil {
		panic(err) // constants
	}
	return cm
}

// assetFetch reports whether a record is a page subresource the site
// served (2xx or 304) or whose answer is unknown.
func assetFetch(d *decisionpb.Decision) bool {
	st := d.GetStatus()
	return (st == 0 || st >= 200 && st < 300 || st == 304) && IsAsset(d.GetDescriptors().GetPath())
}

func newDeviceSpread() *sketch.Spread {
	s, err := sketch.NewSpread(0.01, 0.01, 5)
	if err != nil {
		panic(err) // constants
	}
	return s
}

// NewHeavyHitters returns the signal with o's zero fields defaulted, or an
// error wrapping ErrBadOptions.
func NewHeavyHitters(o HeavyHitterOptions) (*HeavyHitters, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	return &HeavyHitters{o: o, name: "heavy-hitters", baseline: newHHBaseline(), active: coolDown{}}, nil
}

// NewHeavyHitterScales returns the signal at each of o's time scales
// (o.Window, then each long window), sharing one cool-down: the stage at
// o.Window is named heavy-hitters, the others heavy-hitters-<window>. It
// errors as NewHeavyHitters.
func NewHeavyHitterScales(o HeavyHitterOptions) ([]*HeavyHitters, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	active := coolDown{}
	var out []*HeavyHitters
	for i, x := range o.scales() {
		h := &HeavyHitters{o: x, name: "heavy-hitters", baseline: newHHBaseline(), active: active}
		if i > 0 {
			h.name += "-" + x.Window.String()
		}
		out = append(out, h)
	}
	return out, nil
}

// Name is the stage's name in the pipeline.
func (h *HeavyHitters) Name() string { return h.name }

// Window is the event-time window the signal counts in.
func (h *HeavyHitters) Window() time.Duration { return h.o.Window }

// NewPartial returns an empty window state.
func (h *HeavyHitters) NewPartial() stage.Partial {
	return &hhPartial{exempt: h.exempt, top: sketch.NewTopK(h.o.K), ips: sketch.NewDistinct(), devices: newDeviceSpread(), assets: newAssetCounts()}
}

// Observe counts one record with a client IP.
func (p *hhPartial) Observe(d *decisionpb.Decision) {
	ip := d.GetDescriptors().GetClientIp()
	if ip == "" || (p.exempt != nil && p.exempt(d)) {
		return
	}
	hash := sketch.Hash64(ip)
	p.top.AddHash(hash, ip, 1)
	p.ips.InsertHash(hash)
	p.devices.Add(hash, sketch.Hash64(d.GetUserAgent())^sketch.Hash64(d.GetDescriptors().GetJa4())*0x9e3779b97f4a7c15)
	if assetFetch(d) {
		p.assets.Add(hash, 1)
	}
	p.n++
}

// Merge folds in another partition's state of the same window.
func (p *hhPartial) Merge(o stage.Partial) error {
	x, ok := o.(*hhPartial)
	if !ok {
		return fmt.Errorf("detector: heavy hitters cannot merge a %T", o)
	}
	p.top.Merge(x.top)
	p.n += x.n
	if err := p.devices.Merge(x.devices); err != nil {
		return err
	}
	if err := p.assets.Merge(x.assets); err != nil {
		return err
	}
	return p.ips.Merge(x.ips)
}

// MarshalBinary encodes the state: the count as a uvarint, then the top-k's,
// the HyperLogLog's, the devices' and the asset count-min's encodings, each
// prefixed by its length (uvarint).
func (p *hhPartial) MarshalBinary() ([]byte, error) {
	top, err := p.top.MarshalBinary()
	if err != nil {
		return nil, err
	}
	ips, err := p.ips.MarshalBinary()
	if err != nil {
		return nil, err
	}
	devices, err := p.devices.MarshalBinary()
	if err != nil {
		return nil, err
	}
	assets, err := p.assets.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b := binary.AppendUvarint(nil, p.n)
	b = stage.AppendBytes(b, top)
	b = stage.AppendBytes(b, ips)
	b = stage.AppendBytes(b, devices)
	return stage.AppendBytes(b, assets), nil
}

// MarshalState encodes the state kept across windows: the baseline and the
// clients whose rules are fresh (cool-down), sorted by client.
func (h *HeavyHitters) MarshalState() ([]byte, error) {
	base, err := h.baseline.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b := stage.AppendBytes(nil, base)
	b = h.active.appendTo(b)
	// Appended after the fields of the first format, which had none.
	b = binary.AppendVarint(b, h.lastEnd.UnixMilli())
	b = binary.AppendUvarint(b, uint64(len(h.streaks)))
	for _, k := range slices.Sorted(maps.Keys(h.streaks)) {
		b = stage.AppendString(b, k)
		b = binary.AppendUvarint(b, uint64(h.streaks[k]))
	}
	return b, nil
}

// UnmarshalState restores what MarshalState wrote. The state of an older
// version, whose baseline was an EWMA, is read too: its mean seeds the
// median's history.
func (h *HeavyHitters) UnmarshalState(b []byte) error {
	r := stage.NewStateReader(b)
	raw := r.Bytes()
	active := readCoolDown(r)
	var streaks map[string]int
	var lastEnd time.Time
	if r.More() {
		lastEnd = time.UnixMilli(r.Varint())
		n := r.Count(2)
		streaks = make(map[string]int, n)
		for range n {
			k := r.String()
			streaks[k] = int(min(r.Uvarint(), MaxBaseline))
		}
	}
	if err := r.Done(); err != nil {
		return fmt.Errorf("detector: heavy-hitter state: %w", err)
	}
	base := new(sketch.MAD)
	if err := base.UnmarshalBinary(raw); err != nil {
		old := new(sketch.EWMA)
		if old.UnmarshalBinary(raw) != nil {
			return fmt.Errorf("detector: heavy-hitter baseline: %w", err)
		}
		base = newHHBaseline()
		if old.Ready() {
			base.Update(old.Mean())
		}
	}
	h.baseline, h.streaks, h.lastEnd = base, streaks, lastEnd
	h.active.merge(active) // the map the scales share
	return nil
}

// DecodePartial decodes what hhPartial.MarshalBinary wrote, or a state
// written before the asset counts (which it starts empty).
func (h *HeavyHitters) DecodePartial(b []byte) (stage.Partial, error) {
	p := &hhPartial{exempt: h.exempt, top: new(sketch.TopK), ips: new(sketch.Distinct), devices: new(sketch.Spread), assets: newAssetCounts()}
	r := stage.NewStateReader(b)
	p.n = r.Uvarint()
	top, ips, devices := r.Bytes(), r.Bytes(), r.Bytes()
	var assets []byte
	if r.More() {
		assets = r.Bytes()
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("detector: heavy-hitter window state: %w", err)
	}
	if err := p.top.UnmarshalBinary(top); err != nil {
		return nil, fmt.Errorf("detector: heavy-hitter top-k: %w", err)
	}
	if err := p.ips.UnmarshalBinary(ips); err != nil {
		return nil, fmt.Errorf("detector: heavy-hitter distinct clients: %w", err)
	}
	if err := p.devices.UnmarshalBinary(devices); err != nil {
		return nil, fmt.Errorf("detector: heavy-hitter devices: %w", err)
	}
	if assets != nil {
		if err := p.assets.UnmarshalBinary(assets); err != nil {
			return nil, fmt.Errorf("detector: heavy-hitter asset counts: %w", err)
		}
	}
	return p, nil
}

// Finish judges a window merged over every partition and returns the rules
// it flags.
func (h *HeavyHitters) Finish(w stage.Window, merged stage.Partial) stage.Output {
	p, ok := merged.(*hhPartial)
	if !ok {
		return stage.Output{}
	}
	return stage.Output{Rules: h.closeWindow(w.Start, w.End, p)}
}

// reason is a heavy hitter's sentence: its count against the baseline, or,
// before a baseline with no other client in the window, its floor.
func (h *HeavyHitters) reason(it sketch.Item, start time.Time, base float64) string {
	at := start.UTC().Format(time.RFC3339)
	if base <= 0 {
		return fmt.Sprintf("client_ip %s sent %d requests in the %s window from %s, over the floor of %d, with no baseline yet and no other client",
			it.Key, it.Count, h.o.Window, at, h.o.MinCount)
	}
	return fmt.Sprintf("client_ip %s sent %d requests in the %s window from %s, %.0fx the median of %.1f per client",
		it.Key, it.Count, h.o.Window, at, float64(it.Count)/base, base)
}

func (h *HeavyHitters) closeWindow(start, end time.Time, w *hhPartial) []rules.Rule {
	distinct := max(min(w.ips.Estimate(), w.n), 1) // no more clients than requests
	perClient := float64(w.n) / float64(distinct)
	base := perClient
	if h.baseline.Ready() {
		base = h.baseline.Median()
	} else if top := w.top.List(); len(top) > 0 {
		// No baseline yet: the other clients' mean, not one that counts
		// the heaviest, which on a sparse log's first minutes is nearly
		// the only client and stood in for its own bar (a scraper 10 min
		// into SecRepo 2018, alone, was never flagged).
		rest := w.n - min(w.n, top[0].Count-top[0].Err)
		base = float64(rest) / float64(max(distinct-1, 1))
	}
	threshold := max(float64(h.o.MinCount), h.o.Factor*base)
	var out []rules.Rule
	flaggedN, flagged := uint64(0), uint64(0)
	prev := h.streaks
	if !start.Equal(h.lastEnd) {
		prev = nil // not in a row: the streaks are over
	}
	h.streaks, h.lastEnd = nil, end
	for _, it := range w.top.List() {
		if float64(it.Count) <= threshold {
			break // List is sorted by Count: no later item can pass
		}
		// A page's assets count for AssetWeight each: a browser's
		// burst is one document and its subresources.
		assets := min(w.assets.Estimate(sketch.Hash64(it.Key)), it.Count-it.Err)
		count := float64(it.Count-it.Err) - (1-h.o.AssetWeight)*float64(assets)
		if count <= threshold {
			continue // only its overestimate, or its assets, are above the bar
		}
		// An address shared by many devices (distinct JA4 and user-agent
		// pairs), such as a carrier-grade NAT, is judged per device: its
		// users are not one heavy client.
		devices := max(1, w.devices.Estimate(sketch.Hash64(it.Key)))
		if devices >= h.o.SharedDevices && count/float64(devices) <= threshold {
			continue
		}
		flagged++
		flaggedN += it.Count
		streak := prev[it.Key] + 1
		if h.streaks == nil {
			h.streaks = map[string]int{}
		}
		h.streaks[it.Key] = min(streak, h.o.Persist)
		if streak < h.o.Persist {
			continue // heavy, not yet for Persist windows in a row
		}
		if h.active.fresh(it.Key, end, h.o.TTL) {
			continue // cool-down: its rule is still fresh
		}
		limit := max(h.o.MinLimit, int64(math.Ceil(h.o.LimitFactor*base)))
		r := dynamicRule(stage.Window{Start: start, End: end}, h.o.TTL, h.o.Enforce, rules.Rule{
			ID:     "dyn-hh-" + strconv.FormatUint(sketch.Hash64(it.Key), 16),
			Match:  []rules.Match{{Key: rules.KeyClientIP, Value: it.Key}},
			Limit:  limit,
			Period: h.o.Window,
			Origin: "detector/heavy-hitter",
			Reason: h.reason(it, start, base),
			Evidence: map[string]string{
				"count":               strconv.FormatUint(it.Count, 10),
				"count_error":         strconv.FormatUint(it.Err, 10),
				"window_requests":     strconv.FormatUint(w.n, 10),
				"distinct_clients":    strconv.FormatUint(distinct, 10),
				"baseline_per_client": strconv.FormatFloat(base, 'f', 2, 64),
				"threshold":           strconv.FormatFloat(threshold, 'f', 1, 64),
			},
		})
		h.active[it.Key] = r.ExpiresAt
		out = append(out, r)
	}
	h.active.expire(end)
	// The baseline learns from the window without its heavy hitters, so one
	// scraper does not raise the bar for the next.
	if distinct > flagged && w.n > flaggedN {
		h.baseline.Update(float64(w.n-flaggedN) / float64(distinct-flagged))
	}
	return out
}
