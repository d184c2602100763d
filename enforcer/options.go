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
		o.validateRegions, o.validateBudget, o.validateBreaker, o.validateGate, o.validateFallback,
		o.validateShedding, o.validateAdaptive, o.validateHotKeys, o.validateDynamic,
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

// validateBreaker: the circuit breaker's BreakerFailures, BreakerCooldown,
// BreakerWindow, BreakerProbes and BreakerRamp (after the budget: the
// window's default follows it).
func (o *Options) validateBreaker() error {
	if o.BreakerFailures == 0 {
		o.BreakerFailures = 5
	}
	if o.BreakerCooldown == 0 {
		o.BreakerCooldown = time.Second
	}
	if o.BreakerWindow == 0 {
		// Long enough to hold BreakerFailures calls that each waited their
		// longest (2 × Budget) twice over.
		o.BreakerWindow = max(500*time.Millisecond, 4*time.Duration(o.BreakerFailures)*o.Budget)
	}
	if o.BreakerProbes == 0 {
		o.BreakerProbes = 3
	}
	if o.BreakerRamp == 0 {
		o.BreakerRamp = time.Second
	}
	if o.BreakerFailures < 0 || o.BreakerCooldown < 0 || o.BreakerWindow < 0 || o.BreakerProbes < 0 {
		return fmt.Errorf("enforcer: BreakerFailures, BreakerCooldown, BreakerWindow and BreakerProbes must be positive (or 0 for the default)")
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

// validateFallback: Instances (0: learned), Headroom, RememberedKeys,
// LocalBuckets (the failure modes' local buckets) and LocalEntities
// (local-scope rules).
func (o *Options) validateFallback() error {
	if o.RememberedKeys == 0 {
		o.RememberedKeys = 1 << 16
	}
	if o.RememberedKeys > 1<<24 {
		return fmt.Errorf("enforcer: RememberedKeys must be at most 2^24, got %d", o.RememberedKeys)
	}
	if o.Headroom == 0 {
		o.Headroom = 1.2
	}
	if o.LocalBuckets == 0 {
		o.LocalBuckets = 100_000
	}
	if o.LocalEntities == 0 {
		o.LocalEntities = 100_000
	}
	if o.Instances < 0 || o.Headroom < 0 || o.LocalBuckets < 0 || o.LocalEntities < 0 {
		return fmt.Errorf("enforcer: Instances, Headroom, LocalBuckets and LocalEntities must be positive (or 0 for the default; Instances 0 learns the count)")
	}
	return nil
}

// validateShedding: ShedCapacity and ShedRetryAfter.
func (o *Options) validateShedding() error {
	if o.ShedRetryAfter <= 0 {
		o.ShedRetryAfter = time.Second
	}
	if o.ShedCapacity < 0 {
		return fmt.Errorf("enforcer: ShedCapacity must be positive (or 0: no in-flight signal), got %d", o.ShedCapacity)
	}
	return nil
}

// validateAdaptive: the adaptive rules' controller (Adaptive*).
func (o *Options) validateAdaptive() error {
	if o.AdaptiveInterval == 0 {
		o.AdaptiveInterval = time.Second
	}
	if o.AdaptiveMinSamples == 0 {
		o.AdaptiveMinSamples = 10
	}
	if o.AdaptiveDecrease == 0 {
		o.AdaptiveDecrease = 0.7
	}
	if o.AdaptiveErrorRate == 0 {
		o.AdaptiveErrorRate = 0.05
	}
	if o.AdaptiveIncrease == 0 {
		o.AdaptiveIncrease = 0.05
	}
	if o.AdaptiveInterval < 0 || o.AdaptiveMinSamples < 0 || !(o.AdaptiveDecrease > 0 && o.AdaptiveDecrease < 1) ||
		!(o.AdaptiveErrorRate > 0 && o.AdaptiveErrorRate < 1) || !(o.AdaptiveIncrease > 0 && o.AdaptiveIncrease <= 1) || o.AdaptiveLatency < 0 {
		return fmt.Errorf("enforcer: adaptive options: want AdaptiveInterval, AdaptiveMinSamples, AdaptiveLatency >= 0, AdaptiveDecrease and AdaptiveErrorRate in (0, 1), AdaptiveIncrease in (0, 1]")
	}
	return nil
}

// validateHotKeys: the hot-key table (HotKeys, HotKeyRate), leases
// (LeaseBlock, LeaseTTL) and the deny cache.
func (o *Options) validateHotKeys() error {
	if o.HotKeyRate == 0 {
		o.HotKeyRate = 100
	}
	if o.LeaseBlock == 0 {
		o.LeaseBlock = 50
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = time.Second
	}
	if o.HotKeys == 0 {
		o.HotKeys = 1 << 16
	}
	if o.HotKeys > 1<<24 {
		return fmt.Errorf("enforcer: HotKeys must be at most 2^24, got %d", o.HotKeys)
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
