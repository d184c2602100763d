package enforcer

import (
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// validate fills Options' defaults and checks them, once, in New: one
// validator per group of fields (the groups of the Options struct), in
// order, as kgo validates its option groups.
func (o *Options) validate() error {
	for _, v := range []func() error{
		o.validateRegions, o.validateBudget,
		func() error { return o.Breaker.validate(o.Budget) },
		o.validateGate, o.validateFallback, o.Shedding.validate, o.Adaptive.validate, o.HotKeys.validate,
		o.validateDynamic,
	} {
		if err := v(); err != nil {
			return err
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// validateRegions: Region, Instance, Regions, Homes, HomeBudget, shares,
// IPv6Prefix, Clock.
func (o *Options) validateRegions() error {
	if o.Region == "" {
		o.Region = "local"
	}
	if len(o.Homes) > 0 && !rules.ValidID(o.Region) {
		return fmt.Errorf("enforcer: Region %q: a region with Homes needs a name of 1-64 characters of A-Z a-z 0-9 _ . -", o.Region)
	}
	if o.Instance == "" {
		o.Instance = "0"
	}
	if o.Regions == 0 {
		o.Regions = 1
	}
	if o.Regions < 0 {
		return fmt.Errorf("enforcer: Regions must be >= 1, got %d", o.Regions)
	}
	if o.HomeBudget == 0 {
		o.HomeBudget = 500 * time.Millisecond
	}
	if o.HomeBudget < 0 {
		return fmt.Errorf("enforcer: HomeBudget must be positive (or 0 for the default), got %s", o.HomeBudget)
	}
	if o.ShareRefresh == 0 {
		o.ShareRefresh = time.Second
	}
	if o.ShareTTL == 0 {
		o.ShareTTL = 30 * time.Second
	}
	if o.IPv6Prefix == 0 {
		o.IPv6Prefix = 64
	}
	if o.IPv6Prefix < 1 || o.IPv6Prefix > 128 {
		return fmt.Errorf("enforcer: IPv6Prefix must be 1 to 128, got %d", o.IPv6Prefix)
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return nil
}

// validateBudget: Budget, RefundBudget.
func (o *Options) validateBudget() error {
	if o.Budget == 0 {
		o.Budget = 10 * time.Millisecond
	}
	if o.Budget < 0 {
		return fmt.Errorf("enforcer: Budget must be positive (or 0 for the default), got %s", o.Budget)
	}
	if o.Budget < time.Millisecond {
		// The script's deadline is on Redis's clock in whole milliseconds:
		// a shorter budget would make every decision late.
		return fmt.Errorf("enforcer: Budget must be at least 1ms (the script's deadline is in Redis's milliseconds), got %s", o.Budget)
	}
	if o.RefundBudget <= 0 {
		o.RefundBudget = 50 * time.Millisecond
	}
	return nil
}

// validate fills the breaker's defaults and checks them; the window's
// default follows budget (Options.Budget, validated first).
func (b *BreakerOptions) validate(budget time.Duration) error {
	if b.Failures == 0 {
		b.Failures = 5
	}
	if b.Cooldown == 0 {
		b.Cooldown = time.Second
	}
	if b.Window == 0 {
		// Long enough to hold Breaker.Failures calls that each waited their
		// longest (2 × Budget) twice over.
		b.Window = max(500*time.Millisecond, 4*time.Duration(b.Failures)*budget)
	}
	if b.Probes == 0 {
		b.Probes = 3
	}
	if b.Ramp == 0 {
		b.Ramp = time.Second
	}
	if b.Failures < 0 || b.Cooldown < 0 || b.Window < 0 || b.Probes < 0 {
		return fmt.Errorf("enforcer: Breaker.Failures, Breaker.Cooldown, Breaker.Window and Breaker.Probes must be positive (or 0 for the default)")
	}
	return nil
}

// validateGate: MaxInFlight and QueueWait.
func (o *Options) validateGate() error {
	if o.MaxInFlight == 0 {
		o.MaxInFlight = 64 * runtime.GOMAXPROCS(0)
	}
	if o.QueueWait == 0 {
		o.QueueWait = 100 * time.Millisecond
	}
	if o.QueueWait < 0 {
		return fmt.Errorf("enforcer: QueueWait must be positive (or 0 for the default), got %s", o.QueueWait)
	}
	// A request waits for a place at least as long as one decision may
	// wait for Redis, or a slow Redis would have requests shed, not
	// decided by the failure modes.
	o.QueueWait = max(o.QueueWait, 2*o.Budget)
	return nil
}

// validateFallback: Fallback (Instances 0: learned) and LocalEntities
// (local-scope rules).
func (o *Options) validateFallback() error {
	if o.Fallback.RememberedKeys == 0 {
		o.Fallback.RememberedKeys = 1 << 16
	}
	if o.Fallback.RememberedKeys > 1<<24 {
		return fmt.Errorf("enforcer: Fallback.RememberedKeys must be at most 2^24, got %d", o.Fallback.RememberedKeys)
	}
	if o.Fallback.Headroom == 0 {
		o.Fallback.Headroom = 1.2
	}
	if o.Fallback.Buckets == 0 {
		o.Fallback.Buckets = 100_000
	}
	if o.LocalEntities == 0 {
		o.LocalEntities = 100_000
	}
	if o.Fallback.Instances < 0 || o.Fallback.Headroom < 0 || o.Fallback.Buckets < 0 || o.LocalEntities < 0 {
		return fmt.Errorf("enforcer: Fallback.Instances, Fallback.Headroom, Fallback.Buckets and LocalEntities must be positive (or 0 for the default; Fallback.Instances 0 learns the count)")
	}
	return nil
}

// validate fills load shedding's defaults and checks them.
func (sh *SheddingOptions) validate() error {
	if sh.RetryAfter <= 0 {
		sh.RetryAfter = time.Second
	}
	if sh.Capacity < 0 {
		return fmt.Errorf("enforcer: Shedding.Capacity must be positive (or 0: no in-flight signal), got %d", sh.Capacity)
	}
	return nil
}

// validate fills the adaptive controller's defaults and checks them.
func (a *AdaptiveOptions) validate() error {
	if a.Interval == 0 {
		a.Interval = time.Second
	}
	if a.MinSamples == 0 {
		a.MinSamples = 10
	}
	if a.Decrease == 0 {
		a.Decrease = 0.7
	}
	if a.ErrorRate == 0 {
		a.ErrorRate = 0.05
	}
	if a.Increase == 0 {
		a.Increase = 0.05
	}
	if a.Interval < 0 || a.MinSamples < 0 || !(a.Decrease > 0 && a.Decrease < 1) ||
		!(a.ErrorRate > 0 && a.ErrorRate < 1) || !(a.Increase > 0 && a.Increase <= 1) || a.Latency < 0 {
		return fmt.Errorf("enforcer: adaptive options: want Adaptive.Interval, Adaptive.MinSamples, Adaptive.Latency >= 0, Adaptive.Decrease and Adaptive.ErrorRate in (0, 1), Adaptive.Increase in (0, 1]")
	}
	return nil
}

// validate fills the hot-key table's, the leases' and the deny cache's
// defaults and checks them.
func (h *HotKeyOptions) validate() error {
	if h.Rate == 0 {
		h.Rate = 100
	}
	if h.LeaseBlock == 0 {
		h.LeaseBlock = 50
	}
	if h.LeaseTTL <= 0 {
		h.LeaseTTL = time.Second
	}
	if h.Table == 0 {
		h.Table = 1 << 16
	}
	if h.Table > 1<<24 {
		return fmt.Errorf("enforcer: HotKeys.Table must be at most 2^24, got %d", h.Table)
	}
	return nil
}

// validateDynamic: DynamicCap.
func (o *Options) validateDynamic() error {
	if o.DynamicCap == 0 {
		o.DynamicCap = 1000
	}
	if o.DynamicCap < 0 {
		return fmt.Errorf("enforcer: DynamicCap must be positive, got %d", o.DynamicCap)
	}
	return nil
}
