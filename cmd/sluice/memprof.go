//go:build !sidecar

package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"
)

// peakHeapProfile writes a heap profile to path whenever the heap in use
// reaches a new high, sampled every second, so that the file ends up holding
// the profile at the peak (the in-process broker and Redis are gone by the
// time a replay returns). Call the returned stop once: it waits for the
// sampler and writes a last profile if none was written.
func peakHeapProfile(path string) (stop func() error) {
	done, exited := make(chan struct{}), make(chan error, 1)
	go func() {
		var peak uint64
		var err error
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				if peak == 0 {
					err = writeHeap(path)
				}
				exited <- err
				return
			case <-tick.C:
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak+peak/20 { // 5% above the last one written
				peak = ms.HeapInuse
				if werr := writeHeap(path); werr != nil && err == nil {
					err = werr
				}
			}
		}
	}()
	return func() error { close(done); return <-exited }
}

func writeHeap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("--memprofile: %w", err)
	}
	return f.Close()
}
