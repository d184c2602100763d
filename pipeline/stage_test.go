package pipeline

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// countStage is a test stage: per window, the records per client IP (exact),
// a count-min of them and a HyperLogLog of the IPs; its cross-window state
// is a running total, checkpointed. Each finished window becomes one share
// whose key spells out everything, so that two runs' outputs compare
// exactly.
type countStage struct {
	name   string
	window time.Duration
	total  uint64
	delay  time.Duration // per Observe, to make a slow stage
	seen   atomic.Int64
}

func (s *countStage) Name() string          { return s.name }
func (s *countStage) Window() time.Duration { return s.window }
func (s *countStage) NewPartial() Partial   { return newCountPartial(s) }

type countPartial struct {
	s     *countStage
	n     uint64
	perIP map[string]uint64
	cm    *sketch.CountMin
	ips   *sketch.Distinct
}

func newCountPartial(s *countStage) *countPartial {
	cm, err := sketch.NewCountMin(0.01, 0.01)
	if err != nil {
		panic(err)
	}
	return &countPartial{s: s, perIP: map[string]uint64{}, cm: cm, ips: sketch.NewDistinct()}
}

func (p *countPartial) Observe(d *decisionpb.Decision) {
	if p.s.delay > 0 {
		time.Sleep(p.s.delay)
	}
	p.s.seen.Add(1)
	ip := d.GetDescriptors().GetClientIp()
	p.n++
	p.perIP[ip]++
	h := sketch.Hash64(ip)
	p.cm.Add(h, 1)
	p.ips.InsertHash(h)
}

func (p *countPartial) Merge(o Partial) error {
	x, ok := o.(*countPartial)
	if !ok {
		return errors.New("not a count partial")
	}
	p.n += x.n
	for k, v := range x.perIP {
		p.perIP[k] += v
	}
	if err := p.cm.Merge(x.cm); err != nil {
		return err
	}
	return p.ips.Merge(x.ips)
}

func (p *countPartial) MarshalBinary() ([]byte, error) {
	b := binary.AppendUvarint(nil, p.n)
	b = binary.AppendUvarint(b, uint64(len(p.perIP)))
	for _, k := range slices.Sorted(maps.Keys(p.perIP)) {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, p.perIP[k])
	}
	for _, m := range []interface{ MarshalBinary() ([]byte, error) }{p.cm, p.ips} {
		x, err := m.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = binary.AppendUvarint(b, uint64(len(x)))
		b = append(b, x...)
	}
	return b, nil
}

func (s *countStage) DecodePartial(b []byte) (Partial, error) {
	p := newCountPartial(s)
	bad := errors.New("bad count partial")
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	bytesOf := func() ([]byte, bool) {
		n, ok := next()
		if !ok || n > uint64(len(b)) {
			return nil, false
		}
		x := b[:n]
		b = b[n:]
		return x, true
	}
	var ok bool
	if p.n, ok = next(); !ok {
		return nil, bad
	}
	keys, ok := next()
	if !ok || keys > uint64(len(b)) {
		return nil, bad
	}
	for range keys {
		k, ok1 := bytesOf()
		v, ok2 := next()
		if !ok1 || !ok2 {
			return nil, bad
		}
		p.perIP[string(k)] = v
	}
	cm, ok := bytesOf()
	if !ok || p.cm.UnmarshalBinary(cm) != nil {
		return nil, bad
	}
	ips, ok := bytesOf()
	if !ok || p.ips.UnmarshalBinary(ips) != nil || len(b) != 0 {
		return nil, bad
	}
	return p, nil
}

func (s *countStage) Finish(w Window, merged Partial) Output {
	p := merged.(*countPartial)
	s.total += p.n
	keys := slices.SortedFunc(maps.Keys(p.perIP), func(a, b string) int {
		return cmp.Or(cmp.Compare(p.perIP[b], p.perIP[a]), strings.Compare(a, b))
	})
	var top []string
	for _, k := range keys[:min(3, len(keys))] {
		top = append(top, fmt.Sprintf("%s:%d~%d", k, p.perIP[k], p.cm.Estimate(sketch.Hash64(k))))
	}
	key := fmt.Sprintf("n=%d total=%d distinct=%d top=%s", p.n, s.total, p.ips.Estimate(), strings.Join(top, ","))
	return Output{Shares: []rules.Share{{RuleID: s.name, Key: key, Region: "eu", Version: w.End.UnixMilli(), ComputedAt: w.End}}}
}

func (s *countStage) MarshalState() ([]byte, error) { return binary.AppendUvarint(nil, s.total), nil }

func (s *countStage) UnmarshalState(b []byte) error {
	v, n := binary.Uvarint(b)
	if n <= 0 || n != len(b) {
		return errors.New("bad count state")
	}
	s.total = v
	return nil
}
