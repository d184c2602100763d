package main

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
)

// TestWarnTrustAll: found by a fresh user. --trusted-proxies 0.0.0.0/0
// let any caller choose the address it was limited by, without a word.
func TestWarnTrustAll(t *testing.T) {
	for _, c := range []struct {
		nets []string
		warn bool
	}{
		{[]string{"127.0.0.0/8", "::1/128"}, false},
		{[]string{"10.0.0.0/8", "0.0.0.0/0"}, true},
		{[]string{"::/0"}, true},
	} {
		var b bytes.Buffer
		var ps []netip.Prefix
		for _, n := range c.nets {
			ps = append(ps, netip.MustParsePrefix(n))
		}
		warnTrustAll(slog.New(slog.NewTextHandler(&b, nil)), ps)
		if got := strings.Contains(b.String(), "holds every address"); got != c.warn {
			t.Errorf("%v: warned %v, want %v: %q", c.nets, got, c.warn, b.String())
		}
	}
}
