package decision

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// QuotaCount is one region's count in one window of a G-Counter rule
// (rules.Rule.GCounter) for one entity: the unit the regions exchange, read
// from an enforcer's Redis (enforcer.Limiter.QuotaCounts), published on the
// quota topic (pipeline/gcounter) and merged into every other region's Redis
// (enforcer.MergeQuotaCounts). The
// global count of the window is the sum, over the regions, of the largest
// Count seen for each.
type QuotaCount struct {
	Rule   string    `json:"rule"`
	Tag    string    `json:"tag"`    // the entity tag (rules.EntityTag)
	Window time.Time `json:"window"` // the window's start
	End    time.Time `json:"end"`    // the window's end
	Region string    `json:"region"`
	Count  int64     `json:"count"` // cost counted by Region in the window
}

// Validate checks that the count can name a key and a field: an id-like rule
// and region, a 32-hex-digit tag, a window that ends after it starts, and a
// count >= 0.
func (q *QuotaCount) Validate() error {
	switch {
	case !rules.ValidID(q.Rule):
		return fmt.Errorf("quota count: rule %q is not a rule id", q.Rule)
	case !rules.ValidID(q.Region):
		return fmt.Errorf("quota count: region %q is not a region name", q.Region)
	case len(q.Tag) != rules.EntityTagLen || strings.Trim(q.Tag, "0123456789abcdef") != "":
		return fmt.Errorf("quota count: tag %q is not an entity tag (32 lower-case hex digits)", q.Tag)
	case !q.End.After(q.Window):
		return fmt.Errorf("quota count: window %s ends at %s, not after it starts", q.Window, q.End)
	case q.End.Sub(q.Window) > maxQuotaWindow:
		return fmt.Errorf("quota count: window %s ends at %s, more than %v later", q.Window, q.End, maxQuotaWindow)
	case q.Count < 0 || q.Count > maxQuotaCount:
		return fmt.Errorf("quota count: count %d: want 0 to 2^53", q.Count)
	}
	return nil
}

// maxQuotaWindow bounds a G-Counter window's length (a year and a day: a
// calendar month is at most 31 days), so that a record cannot give a
// window's key a TTL of centuries; maxQuotaCount keeps a count exact in
// Lua's doubles.
const (
	maxQuotaWindow = 366 * 24 * time.Hour
	maxQuotaCount  = 1 << 53
)
