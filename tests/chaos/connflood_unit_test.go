package chaos

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// gatedServer accepts connections on 127.0.0.1 and keeps the first limit, resetting the rest on accept.
func gatedServer(t *testing.T, limit int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var kept []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if len(kept) < limit {
				kept = append(kept, c)
			} else {
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range kept {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// TestConnFloodChecker: a port that keeps at most the limit and an admin port that answers pass; a port
// without the limit, or an admin port that does not answer 200, is a finding.
func TestConnFloodChecker(t *testing.T) {
	healthy := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer healthy.Close()
	stalled := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer stalled.Close()
	ok := func(context.Context) error { return nil }
	for _, c := range []struct {
		name    string
		limit   int
		admin   string
		finding string
	}{
		{"enforced", connFloodLimit, healthy.Listener.Addr().String(), ""},
		{"enforced below the limit (other clients hold some)", connFloodLimit - 10, healthy.Listener.Addr().String(), ""},
		{"not enforced", connFloodLimit + connFloodExcess, healthy.Listener.Addr().String(), "--max-connections"},
		{"admin not ready", connFloodLimit, stalled.Listener.Addr().String(), "/healthz answered 503"},
	} {
		o := floodConns(context.Background(), "n1", gatedServer(t, c.limit), c.admin, ok)
		got := strings.Join(o.findings, "; ")
		if (c.finding == "") != (got == "") || !strings.Contains(got, c.finding) {
			t.Errorf("%s: %v, findings %q; want a finding containing %q", c.name, o, got, c.finding)
		}
	}
}
