package rules

import (
	"fmt"
	"testing"
)

// TestHomesSpreadAndMoveLittle checks rendezvous hashing's two promises on
// 50 000 entity tags: each of 5 regions is home to about a fifth of them,
// and removing a region moves only the entities that region was home to
// (each to some other region), none of the others.
func TestHomesSpreadAndMoveLittle(t *testing.T) {
	five := []string{"us-east", "us-west", "eu-west", "ap-south", "sa-east"}
	h5, err := NewHomes(five)
	if err != nil {
		t.Fatal(err)
	}
	h4, err := NewHomes(five[:4]) // sa-east removed
	if err != nil {
		t.Fatal(err)
	}
	const n = 50_000
	per := map[string]int{}
	moved := 0
	var d Descriptors
	r := &Rule{ID: "x", Match: []Match{{Key: KeyAPIKey}}}
	for i := range n {
		d[KeyAPIKey] = fmt.Sprintf("key-%d", i)
		tag := AppendEntityTag(nil, r, &d)
		a, b := h5.Regions()[h5.Of(tag)], h4.Regions()[h4.Of(tag)]
		per[a]++
		if a != b {
			moved++
			if a != "sa-east" {
				t.Fatalf("tag %s moved from %s to %s though %s is still a region", tag, a, b, a)
			}
		}
	}
	for _, reg := range five {
		// A fifth is 10 000; the binomial's standard deviation is about 90.
		if per[reg] < 9_500 || per[reg] > 10_500 {
			t.Errorf("%s is home to %d of %d entities, want about a fifth", reg, per[reg], n)
		}
	}
	if moved != per["sa-east"] {
		t.Errorf("%d entities moved, want exactly the %d whose home was the removed region", moved, per["sa-east"])
	}
}

// TestHomesOrderFree checks that the order the regions are given in does
// not change any entity's home, and that bad region sets are refused.
func TestHomesOrderFree(t *testing.T) {
	a, _ := NewHomes([]string{"b", "a", "c"})
	b, _ := NewHomes([]string{"c", "b", "a"})
	for i := range 1000 {
		tag := []byte(fmt.Sprintf("%032x", i*7919))
		if a.Regions()[a.Of(tag)] != b.Regions()[b.Of(tag)] {
			t.Fatalf("tag %s: home depends on the order of the regions", tag)
		}
	}
	if got, _ := HomeRegion("0123456789abcdef0123456789abcdef", []string{"only"}); got != "only" {
		t.Errorf("one region: home %q", got)
	}
	for _, bad := range [][]string{nil, {"a", "a"}, {"a b"}, {""}} {
		if _, err := NewHomes(bad); err == nil {
			t.Errorf("NewHomes(%q): no error", bad)
		}
	}
	if a.Index("b") != 1 || a.Index("zz") != -1 {
		t.Errorf("Index: %d %d", a.Index("b"), a.Index("zz"))
	}
}
