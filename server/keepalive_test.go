package server_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
)

// TestVanishedClientsStreamEnds: a client whose link goes silent (a black hole: no FIN, no RST) holds a
// Watch stream and a blocking acquire; the node's keepalive pings go unanswered and it closes the
// connection, so the stream and the waiter — and the watcher and queue place they hold — end within
// KeepAliveTime + KeepAliveTimeout. Without server keepalive they stay until TCP gives up, many minutes
// later.
func TestVanishedClientsStreamEnds(t *testing.T) {
	cfg := server.TestConfig()
	cfg.KeepAliveTime, cfg.KeepAliveTimeout = 200*time.Millisecond, 200*time.Millisecond
	s := startSingleNode(t, &cfg)
	if _, err := dial(t, cfg.ClientAddr).Acquire(ctxT(t), &leasepb.AcquireRequest{Resource: "held", Holder: "owner", TtlMs: 60_000}); err != nil {
		t.Fatal(err)
	}

	hole := newBlackHole(t, cfg.ClientAddr)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	vanishing := dial(t, hole.addr())
	if _, err := vanishing.Watch(ctx, &leasepb.WatchRequest{Prefix: "w/"}); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := vanishing.Acquire(ctx, &leasepb.AcquireRequest{Resource: "held", Holder: "waiter", TtlMs: 60_000, Wait: true})
		waited <- err
	}()
	eventually(t, 5*time.Second, "the watch and the waiter to be served", func() bool { return s.Watchers() == 1 && s.Waiters() == 1 })
	hole.swallow()
	cut := time.Now()
	eventually(t, 5*time.Second, "the vanished client's watch and waiter to end", func() bool { return s.Watchers() == 0 && s.Waiters() == 0 })
	t.Logf("the node ended the black-holed client's watch and waiter after %v", time.Since(cut))
	cancel()
	<-waited
}

// TestDefaultKeepaliveEndsAVanishedClientWithinAMinute: with the defaults, the node's pings start after
// 10 s of silence and give up 5 s later, so a vanished client's streams end within about 15 s, well
// within a minute; TestVanishedClientsStreamEnds shows the mechanism with short times.
func TestDefaultKeepaliveEndsAVanishedClientWithinAMinute(t *testing.T) {
	cfg := server.DefaultConfig()
	if bound := cfg.KeepAliveTime + cfg.KeepAliveTimeout; bound <= 0 || bound > time.Minute {
		t.Fatalf("default keepalive time %v + timeout %v = %v, want at most a minute", cfg.KeepAliveTime, cfg.KeepAliveTimeout, bound)
	}
	if cfg.KeepAliveMinTime > cfg.KeepAliveTime {
		t.Fatalf("clients may ping no faster than %v, slower than the node's own %v", cfg.KeepAliveMinTime, cfg.KeepAliveTime)
	}
}

// TestClientPingsAreAcceptedDownToTheMinimum: a client that pings an idle connection (no streams) no
// more often than KeepAliveMinTime keeps it — the SDK's keepalive — while one that pings faster is sent
// GOAWAY ENHANCE_YOUR_CALM. gRPC's default policy (5 minutes, and no pings without streams) disconnected
// the first one too.
func TestClientPingsAreAcceptedDownToTheMinimum(t *testing.T) {
	cfg := server.TestConfig()
	cfg.KeepAliveMinTime = 100 * time.Millisecond
	startSingleNode(t, &cfg)
	if code, ok := pingIdle(t, cfg.ClientAddr, 250*time.Millisecond, 8); ok {
		t.Fatalf("pings every 250ms (minimum 100ms) without streams: GOAWAY %v", code)
	}
	if code, ok := pingIdle(t, cfg.ClientAddr, 10*time.Millisecond, 20); !ok || code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("pings every 10ms (minimum 100ms): GOAWAY %v (sent: %v), want ENHANCE_YOUR_CALM", code, ok)
	}
}

// pingIdle opens a bare HTTP/2 connection to addr, opens no stream, sends n pings every interval, and
// reports the GOAWAY the server sent, if any.
func pingIdle(t *testing.T, addr string, interval time.Duration, n int) (http2.ErrCode, bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var wmu sync.Mutex
	fr := http2.NewFramer(conn, conn)
	write := func(f func() error) error {
		wmu.Lock()
		defer wmu.Unlock()
		return f()
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := write(func() error { return fr.WriteSettings() }); err != nil {
		t.Fatal(err)
	}
	goAway := make(chan http2.ErrCode, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = write(fr.WriteSettingsAck)
				}
			case *http2.GoAwayFrame:
				goAway <- f.ErrCode
				return
			}
		}
	}()
	defer func() {
		_ = conn.Close()
		<-readDone
	}()
	for i := range n {
		select {
		case code := <-goAway:
			return code, true
		case <-time.After(interval):
		}
		if err := write(func() error { return fr.WritePing(false, [8]byte{byte(i)}) }); err != nil {
			break
		}
	}
	select {
	case code := <-goAway:
		return code, true
	case <-time.After(200 * time.Millisecond):
		return 0, false
	}
}

// blackHole is a TCP proxy to one address that can start swallowing every byte both ways without
// closing anything, as a link that silently drops packets.
type blackHole struct {
	lis     net.Listener
	dropped atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func newBlackHole(t *testing.T, target string) *blackHole {
	b := &blackHole{lis: listenLocal(t)}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := b.lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, c, up)
			b.mu.Unlock()
			b.wg.Add(2)
			go b.pipe(c, up)
			go b.pipe(up, c)
		}
	}()
	t.Cleanup(b.close)
	return b
}

func (b *blackHole) addr() string { return b.lis.Addr().String() }

// swallow drops every byte from now on, both ways.
func (b *blackHole) swallow() { b.dropped.Store(true) }

func (b *blackHole) pipe(from, to net.Conn) {
	defer b.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !b.dropped.Load() {
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (b *blackHole) close() {
	_ = b.lis.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}
