package redistest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Fault is what a Proxy does to the traffic it carries.
type Fault uint8

const (
	// Pass forwards bytes as they come.
	Pass Fault = iota
	// Refuse closes the listening socket and every connection: new
	// connections are refused (ECONNREFUSED), as by a server that is down.
	Refuse
	// Blackhole accepts connections and delivers nothing in either
	// direction: bytes are held, as by a network that drops packets while
	// TCP retransmits, and delivered if the fault ends (a request sent
	// during the fault then reaches the server late).
	Blackhole
	// Delay holds each chunk from the server for the proxy's delay before
	// delivering it: with one request in flight per connection, as Redis
	// clients send, every reply is that much late.
	Delay
	// Latency holds each chunk, in both directions, for half the proxy's
	// delay: a link whose round-trip time is the delay, such as a WAN
	// between regions (no bandwidth limit, no loss). Chunks keep their
	// order.
	Latency
)

// Proxy is a fault-injecting TCP proxy on loopback between clients and one
// upstream server, for tests of what a client does when the server is down,
// silent or slow. Its zero value is not usable: start one with NewProxy. It
// is safe for concurrent use; the test's cleanup closes it.
//
// It runs in the test's process: it adds four goroutines per open
// connection (a reader and a writer each way), which a test that counts
// goroutines must allow for.
type Proxy struct {
	t        testing.TB
	addr     string
	upstream string

	mu      sync.Mutex
	fault   Fault
	delay   time.Duration
	changed chan struct{} // closed and replaced at every change of fault
	ln      net.Listener  // nil while refusing
	links   map[*link]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// NewProxy starts a proxy to upstream on a free loopback port, passing
// traffic. The proxy is closed at the test's cleanup.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, addr: ln.Addr().String(), upstream: upstream, changed: make(chan struct{}), links: map[*link]struct{}{}}
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address, for clients.
func (p *Proxy) Addr() string { return p.addr }

// Upstream is the address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

// SetUpstream changes where new connections go (for a server that starts
// after its proxy, whose address must be known first).
func (p *Proxy) SetUpstream(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.upstream = addr
}

// Inject sets the fault; delay is the Delay fault's (or Latency's round
// trip), ignored by the others.
// Passing again after Refuse listens again on the same address.
func (p *Proxy) Inject(f Fault, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.fault, p.delay = f, delay
	close(p.changed)
	p.changed = make(chan struct{})
	switch {
	case f == Refuse && p.ln != nil:
		p.ln.Close()
		p.ln = nil
		for l := range p.links {
			l.close()
		}
	case f != Refuse && p.ln == nil:
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			p.t.Errorf("proxy: listening again on %s: %v", p.addr, err)
			return
		}
		p.serveLocked(ln)
	}
}

// Fault returns the fault in force.
func (p *Proxy) Fault() Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fault
}

// Conns is how many client connections the proxy holds open.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.serveLocked(ln)
}

func (p *Proxy) serveLocked(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed: Refuse or the proxy's close
			}
			p.open(c)
		}
	}()
}

// open links client connection c to the upstream. While the fault is
// Blackhole the upstream is not dialled until it ends, as a SYN that does
// not get through.
func (p *Proxy) open(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ln == nil {
		c.Close()
		return
	}
	l := &link{p: p, client: c, done: make(chan struct{})}
	p.links[l] = struct{}{}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		l.run(p.upstream)
	}()
}

// state returns the fault, its delay and a channel closed at its next change.
func (p *Proxy) state() (Fault, time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fault, p.delay, p.changed
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
	}
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// link is one client connection and its upstream connection.
type link struct {
	p      *Proxy
	client net.Conn
	done   chan struct{}

	mu       sync.Mutex
	closed   bool
	upstream net.Conn
}

func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.done)
	l.client.Close()
	if l.upstream != nil {
		l.upstream.Close()
	}
}

// connected records the upstream connection, or closes it and reports
// false if the link closed while it was dialled.
func (l *link) connected(u net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		u.Close()
		return false
	}
	l.upstream = u
	return true
}

// chunk is bytes read at a time.
type chunk struct {
	b  []byte
	at time.Time
}

func (l *link) run(upstream string) {
	defer func() {
		l.close()
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	}()
	// Read the client at once, so that its close is seen while blackholed.
	toServer := make(chan chunk, 16)
	go l.read(l.client, toServer)
	if !l.wait(time.Time{}, false) {
		return
	}
	u, err := net.DialTimeout("tcp", upstream, time.Second)
	if err != nil {
		return // the client sees its connection closed
	}
	if !l.connected(u) {
		return
	}
	toClient := make(chan chunk, 16)
	go l.read(u, toClient)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); l.write(l.client, toClient, true) }()
	l.write(u, toServer, false)
	l.close()
	wg.Wait()
}

// read sends what src sends, chunk by chunk, until it fails or the link
// closes; then it closes the link.
func (l *link) read(src net.Conn, out chan<- chunk) {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case out <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}:
			case <-l.done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// write delivers chunks to dst as the fault allows: held while blackholed,
// and from the server (fromServer) held until read time + delay under Delay,
// both ways until read time + delay/2 under Latency.
func (l *link) write(dst net.Conn, in <-chan chunk, fromServer bool) {
	for {
		var c chunk
		select {
		case c = <-in:
		case <-l.done:
			return
		}
		if !l.wait(c.at, fromServer) {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			l.close()
			return
		}
	}
}

// wait blocks while the fault holds a chunk read at at, and reports false
// if the link closes meanwhile.
func (l *link) wait(at time.Time, fromServer bool) bool {
	for {
		f, d, changed := l.p.state()
		var t *time.Timer
		var timer <-chan time.Time
		switch {
		case f == Blackhole:
		case f == Delay && fromServer && time.Until(at.Add(d)) > 0:
			t = time.NewTimer(time.Until(at.Add(d)))
			timer = t.C
		case f == Latency && !at.IsZero() && time.Until(at.Add(d/2)) > 0:
			t = time.NewTimer(time.Until(at.Add(d / 2)))
			timer = t.C
		default:
			return true
		}
		select {
		case <-l.done:
			return false
		case <-changed:
			if t != nil {
				t.Stop()
			}
		case <-timer:
			return true
		}
	}
}
