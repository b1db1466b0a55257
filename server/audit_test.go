package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// syncBuffer is a bytes.Buffer safe for the node's goroutines to log into.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// auditLines are the JSON log lines of the audit trail in s.
func auditLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("not a JSON log line: %q: %v", sc.Text(), err)
		}
		if msg, _ := line["msg"].(string); strings.HasPrefix(msg, "lease ") {
			out = append(out, line)
		}
	}
	return out
}

// startAuditedNode starts a single node that logs at info level, as JSON, into logs.
func startAuditedNode(t *testing.T, logs io.Writer) (server.Config, *server.Server, leasepb.LeasesClient) {
	t.Helper()
	cfg := server.TestConfig()
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := startSingleNode(t, &cfg)
	return cfg, s, dial(t, s.ClientAddr())
}

// TestAuditTrail: a grant, a release and an expiry each make one info line on the (single) node, in the
// JSON format of --log-format json, with the constant keys.
func TestAuditTrail(t *testing.T) {
	logs := &syncBuffer{}
	cfg, _, cl := startAuditedNode(t, logs)
	ctx := ctxT(t)
	a, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "audit/a", Holder: "alice", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Release(ctx, &leasepb.ReleaseRequest{Resource: "audit/a", Token: a.GetLease().GetToken()}); err != nil {
		t.Fatal(err)
	}
	b, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "audit/b", Holder: "bob", TtlMs: cfg.TTLFloor().Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the expiry's audit line", func() bool {
		return strings.Contains(logs.String(), `"msg":"lease expired"`)
	})
	type want struct {
		msg, event, resource, holder string
		token                        uint64
	}
	wants := []want{
		{"lease granted", "granted", "audit/a", "alice", a.GetLease().GetToken()},
		{"lease released", "released", "audit/a", "alice", a.GetLease().GetToken()},
		{"lease granted", "granted", "audit/b", "bob", b.GetLease().GetToken()},
		{"lease expired", "expired", "audit/b", "bob", b.GetLease().GetToken()},
	}
	lines := auditLines(t, logs.String())
	if len(lines) != len(wants) {
		t.Fatalf("audit lines = %v, want %d", lines, len(wants))
	}
	for i, w := range wants {
		l := lines[i]
		if l["level"] != "INFO" || l["msg"] != w.msg || l["event"] != w.event || l["resource"] != w.resource ||
			l["holder"] != w.holder || l["token"] != float64(w.token) || l["role"] != "leader" || l["node"] != "n1" {
			t.Errorf("audit line %d = %v, want %+v on the leader n1", i, l, w)
		}
		if idx, _ := l["index"].(float64); idx < float64(w.token) {
			t.Errorf("audit line %d: index %v before the grant %d", i, l["index"], w.token)
		}
	}
	if lines[0]["index"] != float64(a.GetLease().GetToken()) {
		t.Errorf("a grant's index %v is not its token %d", lines[0]["index"], a.GetLease().GetToken())
	}
}

// gatedWriter holds every write while its gate is shut: a log sink that stopped reading.
type gatedWriter struct {
	syncBuffer
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (w *gatedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	gate := w.gate
	w.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return w.syncBuffer.Write(p)
}

func (w *gatedWriter) shut() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gate = make(chan struct{})
	return w.gate
}

// TestAuditTrailIsWrittenOffTheLoopAndCompleteAtClose: the node writes its audit lines off the Ready
// loop — grants are answered while the log sink is not reading — and a node that stops writes every line
// it had handed over before Close returns.
func TestAuditTrailIsWrittenOffTheLoopAndCompleteAtClose(t *testing.T) {
	// Only the audit sink is stuck: the operational log is written where it happens, the Ready loop included, and a node
	// under load logs from it (a slow fsync, say).
	logs := &gatedWriter{}
	cfg := server.TestConfig()
	cfg.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	cfg.AuditLog = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := startSingleNode(t, &cfg)
	cl := dial(t, s.ClientAddr())
	gate := logs.shut()
	openGate := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(openGate) // before the node's Close: a loop stuck writing a line could not stop
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const n = 20 // well under the writer's backlog of batches
	for i := range n {
		if _, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "audit/" + strconv.Itoa(i), Holder: "h", TtlMs: 60_000}); err != nil {
			t.Fatalf("acquire %d while the log sink is stuck: %v", i, err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	openGate()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if got := len(auditLines(t, logs.String())); got != n {
		t.Fatalf("%d audit lines after Close, want %d:\n%s", got, n, logs.String())
	}
}

// TestAuditTrailOneInfoLinePerEvent: in a three-node cluster the leader alone writes the trail at info,
// so each event has exactly one info line for the whole cluster, with role=leader.
func TestAuditTrailOneInfoLinePerEvent(t *testing.T) {
	logs := &syncBuffer{}
	c := servertest.Start(t, 3, func(cfg *server.Config) {
		cfg.AuditLog = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	leader := c.WaitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var tokens []uint64
	for i := range 5 {
		a, err := c.Leases(leader).Acquire(ctx, &leasepb.AcquireRequest{Resource: "one/" + strconv.Itoa(i), Holder: "h", TtlMs: 60_000})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, a.GetLease().GetToken())
	}
	c.WaitSettled() // every node applied every grant
	count := map[float64]int{}
	for _, l := range auditLines(t, logs.String()) {
		if l["role"] != "leader" || l["level"] != "INFO" {
			t.Errorf("audit line %v: want role=leader at INFO", l)
		}
		count[l["token"].(float64)]++
	}
	for _, tok := range tokens {
		if count[float64(tok)] != 1 {
			t.Errorf("grant %d has %d info lines in the cluster, want 1", tok, count[float64(tok)])
		}
	}
}

// droppingWriter loses every line while drop is set: a leader that stops before its lines reach the sink.
type droppingWriter struct {
	syncBuffer
	drop atomic.Bool
}

func (w *droppingWriter) Write(p []byte) (int, error) {
	if w.drop.Load() {
		return len(p), nil
	}
	return w.syncBuffer.Write(p)
}

// TestAuditTrailSurvivesALostLeader: grants whose lines the leader never wrote (its sink lost them, as a
// SIGKILLed leader loses what it had not written) are written by the next leader, marked replayed.
func TestAuditTrailSurvivesALostLeader(t *testing.T) {
	sinks := map[string]*droppingWriter{}
	c := servertest.Start(t, 3, func(cfg *server.Config) {
		w := &droppingWriter{}
		sinks[cfg.Name] = w
		cfg.AuditLog = slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	leader := c.WaitLeader()
	sinks[c.Config(leader).Name].drop.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lost []float64
	for i := range 3 {
		a, err := c.Leases(leader).Acquire(ctx, &leasepb.AcquireRequest{Resource: "lost/" + strconv.Itoa(i), Holder: "h", TtlMs: 60_000})
		if err != nil {
			t.Fatal(err)
		}
		lost = append(lost, float64(a.GetLease().GetToken()))
	}
	c.WaitSettled()
	c.Stop(leader)
	eventually(t, 20*time.Second, "the new leader's replayed lines", func() bool {
		replayed := map[float64]bool{}
		for name, w := range sinks {
			if name == c.Config(leader).Name {
				continue
			}
			for _, l := range auditLines(t, w.String()) {
				if l["role"] == "leader" && l["replayed"] == true && l["level"] == "INFO" {
					replayed[l["token"].(float64)] = true
				}
			}
		}
		for _, tok := range lost {
			if !replayed[tok] {
				return false
			}
		}
		return true
	})
}
