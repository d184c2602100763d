package sketch_test

import (
	"fmt"

	"github.com/sluice-rl/sluice/sketch"
)

func Example() {
	counts, err := sketch.NewCountMin(0.001, 0.01)
	if err != nil {
		panic(err)
	}
	top := sketch.NewTopK(100)
	clients := sketch.NewDistinct()

	for i := range 10_000 {
		id := fmt.Sprintf("client-%d", i%499)
		if i%4 == 0 {
			id = "client-hot" // a quarter of all requests
		}
		h := sketch.Hash64(id)
		counts.Add(h, 1)
		top.Add(id, 1)
		clients.InsertHash(h)
	}

	fmt.Println("requests:", counts.Total())
	fmt.Println("client-hot at least:", counts.Estimate(sketch.Hash64("client-hot")))
	fmt.Println("distinct clients about:", clients.Estimate())
	for _, it := range top.List()[:1] {
		fmt.Printf("heaviest: %s in [%d, %d]\n", it.Key, it.Count-it.Err, it.Count)
	}
	// Output:
	// requests: 10000
	// client-hot at least: 2500
	// distinct clients about: 500
	// heaviest: client-hot in [2500, 2500]
}

func ExampleCountMin_Merge() {
	a, _ := sketch.NewCountMin(0.01, 0.01)
	b, _ := sketch.NewCountMin(0.01, 0.01)
	h := sketch.Hash64("10.0.0.1")
	a.Add(h, 3)
	b.Add(h, 4)

	// Ship b to the aggregator and merge it there.
	buf, _ := b.MarshalBinary()
	var got sketch.CountMin
	if err := got.UnmarshalBinary(buf); err != nil {
		panic(err)
	}
	if err := a.Merge(&got); err != nil {
		panic(err)
	}
	fmt.Println(a.Estimate(h), a.Total())
	// Output: 7 7
}

func ExampleEWMA() {
	base := sketch.NewEWMA(0.1, 5)
	for _, rps := range []float64{100, 104, 98, 101, 97, 99, 300} {
		if base.Ready() && rps > base.Mean()+4*base.StdDev() {
			fmt.Printf("spike: %.0f rps over a baseline of %.0f±%.0f\n", rps, base.Mean(), base.StdDev())
		}
		base.Update(rps)
	}
	// Output: spike: 300 rps over a baseline of 100±2
}
