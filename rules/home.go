package rules

import (
	"fmt"
	"slices"
)

// Homes is the set of regions among which a pinned rule's entities have
// their home (see Rule.Pinned): every enforcer in every region must be
// given the same set, so that they agree on each entity's home.
//
// An entity's home is chosen by rendezvous, or highest-random-weight,
// hashing (Thaler and Ravishankar, "Using Name-Based Mappings to Increase
// Hit Rates", IEEE/ACM Transactions on Networking 6(1), 1998): each region
// scores the entity tag, and the highest score wins. Adding or removing a
// region moves only the entities whose home it becomes or was (about 1/n of
// them), and each region is home to about 1/n of the entities. The score is
// the splitmix64 finaliser (Steele, Lea and Flood, "Fast Splittable
// Pseudorandom Number Generators", OOPSLA 2014) of the region's FNV-1a hash
// xor the tag's.
//
// The zero value has no region; build one with NewHomes. A Homes is
// immutable and safe for concurrent use.
type Homes struct {
	names []string
	seeds []uint64
}

// NewHomes returns the set of the named regions (each a valid id, see
// ValidID; duplicates are an error), held in sorted order so that the order
// they are given in does not matter.
func NewHomes(regions []string) (*Homes, error) {
	if len(regions) == 0 {
		return nil, fmt.Errorf("rules: no home regions")
	}
	names := slices.Clone(regions)
	slices.Sort(names)
	h := &Homes{names: names, seeds: make([]uint64, len(names))}
	for i, n := range names {
		if !ValidID(n) {
			return nil, fmt.Errorf("rules: home region %q: want 1-%d characters of A-Z a-z 0-9 _ . -", n, maxIDLen)
		}
		if i > 0 && names[i-1] == n {
			return nil, fmt.Errorf("rules: home region %q is given twice", n)
		}
		h.seeds[i] = fnv1a(n)
	}
	return h, nil
}

// Regions returns the regions, sorted; the caller must not modify it.
func (h *Homes) Regions() []string { return h.names }

// Index returns the index in Regions of region, or -1.
func (h *Homes) Index(region string) int {
	i, ok := slices.BinarySearch(h.names, region)
	if !ok {
		return -1
	}
	return i
}

// Of returns the index in Regions of the home region of the entity with the
// given tag (EntityTag). It allocates nothing.
func (h *Homes) Of(tag []byte) int {
	k := fnv1a(tag)
	best, bestScore := 0, uint64(0)
	for i, s := range h.seeds {
		if score := mix64(s ^ k); i == 0 || score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// HomeRegion returns the home region of the entity with the given tag
// among regions; see Homes.
func HomeRegion(tag string, regions []string) (string, error) {
	h, err := NewHomes(regions)
	if err != nil {
		return "", err
	}
	return h.names[h.Of([]byte(tag))], nil
}

// fnv1a is the 64-bit FNV-1a hash of s (Fowler, Noll and Vo;
// draft-eastlake-fnv).
func fnv1a[T string | []byte](s T) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is splitmix64's finaliser: every bit of x affects every bit of the
// result.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
