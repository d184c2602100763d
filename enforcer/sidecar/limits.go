package sidecar

import (
	"fmt"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sluice-rl/sluice/enforcer"
)

// Length limits of a check, in bytes of UTF-8 (or, for MaxEntries, entries
// per descriptor). A request past one is refused with InvalidArgument (HTTP
// 400) naming the descriptor and entry, before any of it is decided; a whole
// request is at most Options.MaxBody (64 KiB) over every API (gRPC refusing a
// larger message with ResourceExhausted before reading it; forward-auth
// counts the headers it reads). An entry's value has no limit of its own
// within that bound, as envoyproxy/ratelimit has none: a long path or token
// is matched and counted whole, under a key of fixed length (a rule's key is
// a hash of its entries' values, rules.EntityTagLen), and a value longer than
// enforcer.MaxValue (4 096 bytes) is replaced in decision records by its
// keyed hash (enforcer.Limiter.HashValue).
const (
	// MaxDomain caps a request's domain.
	MaxDomain = 256
	// MaxEntryKey caps an entry's key (a descriptor key's name).
	MaxEntryKey = 256
	// MaxEntries caps the entries of one descriptor.
	MaxEntries = 64
)

// checkLengths refuses a request past the length limits, without
// allocating unless it refuses.
func checkLengths(in *rlsv3.RateLimitRequest) error {
	if n := len(in.GetDomain()); n > MaxDomain {
		return fmt.Errorf("%w: domain of %d bytes, more than %d (sidecar.MaxDomain)", enforcer.ErrBadRequest, n, MaxDomain)
	}
	// Descriptors and entries are counted from 1 in errors, as rules are.
	for di, d := range in.GetDescriptors() {
		es := d.GetEntries()
		if len(es) > MaxEntries {
			return fmt.Errorf("%w: descriptor %d: %d entries, more than %d (sidecar.MaxEntries)", enforcer.ErrBadRequest, di+1, len(es), MaxEntries)
		}
		for ei, e := range es {
			if n := len(e.GetKey()); n > MaxEntryKey {
				return fmt.Errorf("%w: descriptor %d, entry %d (key %q...): key of %d bytes, more than %d (sidecar.MaxEntryKey)",
					enforcer.ErrBadRequest, di+1, ei+1, e.GetKey()[:32], n, MaxEntryKey)
			}
		}
	}
	return nil
}

// The gRPC server's bounds, as the HTTP listener's (sluice serve): a
// connection has HandshakeTimeout to complete its HTTP/2 handshake (the
// HTTP listener's ReadHeaderTimeout), carries at most MaxStreams RPCs at
// once, is closed after IdleTimeout without one (HTTP's IdleTimeout), and is
// pinged after PingInterval of silence and closed if the ping is not
// answered within PingTimeout. Clients may ping every PingMinInterval
// (gRPC's own default allows one each 5 minutes, which Envoy's
// connection_keepalive would break).
const (
	HandshakeTimeout = 5 * time.Second
	MaxStreams       = 256
	IdleTimeout      = 2 * time.Minute
	PingInterval     = 30 * time.Second
	PingTimeout      = 10 * time.Second
	PingMinInterval  = 10 * time.Second
)

// boundOptions are NewGRPCServer's bounds: the receive size (MaxBody), the
// streams per connection and the timeouts above.
func (s *Server) boundOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(s.opts.MaxBody)),
		grpc.MaxConcurrentStreams(MaxStreams),
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: IdleTimeout, Time: PingInterval, Timeout: PingTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: PingMinInterval, PermitWithoutStream: true}),
	}
}
