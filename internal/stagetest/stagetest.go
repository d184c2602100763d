// Package stagetest holds a test stage for the pipeline's tests: CountStage,
// which counts records per client IP exactly and with a count-min and a
// HyperLogLog, so that runs over 1 or N partitions compare exactly.
package stagetest

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
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// CountStage is a test stage: per window, the records per client IP (exact),
// a count-min of them and a HyperLogLog of the IPs; its cross-window state
// is a running total, checkpointed. Each finished window becomes one share
// whose key spells out everything, so that two runs' outputs compare
// exactly.
type CountStage struct {
	ID    string        // the stage's name
	Size  time.Duration // its window
	Total uint64        // records over every finished window (the checkpointed state)
	Delay time.Duration // per Observe, to make a slow stage
	Seen  atomic.Int64  // records observed
}

func (s *CountStage) Name() string              { return s.ID }
func (s *CountStage) Window() time.Duration     { return s.Size }
func (s *CountStage) NewPartial() stage.Partial { return newCountPartial(s) }

type countPartial struct {
	s     *CountStage
	n     uint64
	perIP map[string]uint64
	cm    *sketch.CountMin
	ips   *sketch.Distinct
}

func newCountPartial(s *CountStage) *countPartial {
	cm, err := sketch.NewCountMin(0.01, 0.01)
	if err != nil {
		panic(err)
	}
	return &countPartial{s: s, perIP: map[string]uint64{}, cm: cm, ips: sketch.NewDistinct()}
}

func (p *countPartial) Observe(d *decisionpb.Decision) {
	if p.s.Delay > 0 {
		time.Sleep(p.s.Delay)
	}
	p.s.Seen.Add(1)
	ip := d.GetDescriptors().GetClientIp()
	p.n++
	p.perIP[ip]++
	h := sketch.Hash64(ip)
	p.cm.Add(h, 1)
	p.ips.InsertHash(h)
}

func (p *countPartial) Merge(o stage.Partial) error {
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

func (s *CountStage) DecodePartial(b []byte) (stage.Partial, error) {
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

func (s *CountStage) Finish(w stage.Window, merged stage.Partial) stage.Output {
	p := merged.(*countPartial)
	s.Total += p.n
	keys := slices.SortedFunc(maps.Keys(p.perIP), func(a, b string) int {
		return cmp.Or(cmp.Compare(p.perIP[b], p.perIP[a]), strings.Compare(a, b))
	})
	var top []string
	for _, k := range keys[:min(3, len(keys))] {
		top = append(top, fmt.Sprintf("%s:%d~%d", k, p.perIP[k], p.cm.Estimate(sketch.Hash64(k))))
	}
	key := fmt.Sprintf("n=%d total=%d distinct=%d top=%s", p.n, s.Total, p.ips.Estimate(), strings.Join(top, ","))
	return stage.Output{Shares: []rules.Share{{RuleID: s.ID, Key: key, Region: "eu", Version: w.End.UnixMilli(), ComputedAt: w.End}}}
}

func (s *CountStage) MarshalState() ([]byte, error) { return binary.AppendUvarint(nil, s.Total), nil }

func (s *CountStage) UnmarshalState(b []byte) error {
	v, n := binary.Uvarint(b)
	if n <= 0 || n != len(b) {
		return errors.New("bad count state")
	}
	s.Total = v
	return nil
}
