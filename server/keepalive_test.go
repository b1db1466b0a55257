package server_test

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
)

// TestVanishedClientsStreamEnds: a client whose link goes silent (a black hole: no FIN, no RST) holds a
// Watch stream; the node's keepalive pings go unanswered and it closes the connection, so the stream —
// and the watcher it holds — ends within KeepAliveTime + KeepAliveTimeout. Without server keepalive the
// stream stays until TCP gives up, many minutes later.
func TestVanishedClientsStreamEnds(t *testing.T) {
	cfg := server.TestConfig()
	cfg.KeepAliveTime, cfg.KeepAliveTimeout = 200*time.Millisecond, 200*time.Millisecond
	cfg.Name, cfg.DataDir = "n1", filepath.Join(t.TempDir(), "n1")
	lis := server.Listeners{Client: listenLocal(t), Peer: listenLocal(t)}
	cfg.ClientAddr, cfg.PeerAddr = lis.Client.Addr().String(), lis.Peer.Addr().String()
	cfg.InitialCluster = map[string]string{"n1": cfg.PeerAddr}
	s, err := server.New(cfg, lis)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	eventually(t, 5*time.Second, "leader", s.IsLeader)

	hole := newBlackHole(t, cfg.ClientAddr)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	if _, err := dial(t, hole.addr()).Watch(ctx, &leasepb.WatchRequest{Prefix: "w/"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the watch to be served", func() bool { return s.Watchers() == 1 })
	hole.swallow()
	cut := time.Now()
	eventually(t, 5*time.Second, "the vanished client's watch to end", func() bool { return s.Watchers() == 0 })
	t.Logf("the node ended the black-holed client's watch after %v", time.Since(cut))
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
