package backoff_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-rl/sluice/enforcer/backoff"
)

// A client of an API that sluice limits: retries of 429 and 503 with
// decorrelated jitter, never before Retry-After, and requests held back while
// the quota is spent. (No Output: it would call the network.)
func ExampleNew() {
	tr, err := backoff.New(http.DefaultTransport,
		backoff.WithMaxAttempts(5),      // default 4
		backoff.WithCap(30*time.Second), // default 20 s
		backoff.WithLowRemaining(2))     // pace when 2 or fewer remain; default 0 (off)
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr, Timeout: time.Minute} // the timeout bounds the waits too
	resp, err := client.Get("https://api.example.com/v1/items")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status) // may still be 429 when attempts ran out
}
