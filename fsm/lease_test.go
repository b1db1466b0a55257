package fsm

import (
	"testing"
	"unsafe"

	"github.com/leased/leased/api/wirepb"
)

// TestLeaseFitsTheSmallerSizeClass: a node holds a lease struct per lease, and the runtime rounds it up
// to a size class; past 112 bytes it costs 128.
func TestLeaseFitsTheSmallerSizeClass(t *testing.T) {
	if size := unsafe.Sizeof(lease{}); size > 112 {
		t.Fatalf("a lease is %d bytes: it no longer fits the 112-byte size class", size)
	}
}

// TestDurationsBeyondTheStoredRangeSaturate: the server refuses a TTL or lock-delay over MaxDurationMs,
// but an entry that asks for one anyway is applied the same way on every node, and its retry is still
// recognized as the same request.
func TestDurationsBeyondTheStoredRangeSaturate(t *testing.T) {
	f := New()
	c := &wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 1 << 40, LockDelayMs: MaxDurationMs + 1, RequestId: "q",
		Value: []byte("v")}
	res, err := f.Apply(1, acqWith(c))
	if err != nil || res.Code != OK {
		t.Fatalf("acquire: %v %v", res.Code, err)
	}
	if l := res.Lease; l.TTLMs != MaxDurationMs || l.LockDelayMs != MaxDurationMs || string(l.Value) != "v" {
		t.Fatalf("granted ttl %d, lock-delay %d, value %q; want both %d and %q", l.TTLMs, l.LockDelayMs, l.Value, MaxDurationMs, "v")
	}
	again, err := f.Apply(2, acqWith(c))
	if err != nil || again.Code != OK || again.Lease.Token != 1 {
		t.Fatalf("the same request retried: %v %v token %d; want its grant replayed", again.Code, err, again.Lease.Token)
	}
	neg := &wirepb.AcquireCmd{Resource: "s", Holder: "h", TtlMs: -5}
	if res, _ := f.Apply(3, acqWith(neg)); res.Lease.TTLMs != 0 {
		t.Fatalf("a negative TTL stored as %d, want 0", res.Lease.TTLMs)
	}
}

// TestHolderIdentitiesAreSharedNotMixed: a holder's leases granted under one identity keep one copy of
// its name, through a restore too, and a grant under another identity keeps its own: sharing never gives
// a lease another's identity.
func TestHolderIdentitiesAreSharedNotMixed(t *testing.T) {
	f := New()
	if _, err := f.Apply(1, setACL(false, rule("alice", "", permLease), rule("bob", "", permLease))); err != nil {
		t.Fatal(err)
	}
	grants := []struct{ resource, identity string }{
		{"a", "alice"}, {"b", "alice"}, {"c", "bob"}, {"d", "alice"}, {"e", ""}, {"f", "alice"},
	}
	for i, g := range grants {
		// A fresh copy of the name, as each decoded command has.
		id := string([]byte(g.identity))
		c := &wirepb.AcquireCmd{Resource: g.resource, Holder: "h", TtlMs: 1000, Identity: id}
		if res, err := f.Apply(uint64(i+2), acqWith(c)); err != nil || res.Code != OK {
			t.Fatalf("acquire %s: %v %v", g.resource, res.Code, err)
		}
	}
	for name, state := range map[string]*FSM{"applied": f, "restored": mustRestore(t, mustSnapshot(t, f))} {
		for _, g := range grants {
			if l := mustLookup(t, state, g.resource); l.identity != g.identity {
				t.Fatalf("%s: %s has identity %q, want %q", name, g.resource, l.identity, g.identity)
			}
		}
		a, b := mustLookup(t, state, "a"), mustLookup(t, state, "b")
		if unsafe.StringData(a.identity) != unsafe.StringData(b.identity) {
			t.Fatalf("%s: two leases of one holder and identity keep two copies of its name", name)
		}
	}
}

func mustLookup(t *testing.T, f *FSM, resource string) *lease {
	t.Helper()
	l, ok := f.lookup(resource)
	if !ok {
		t.Fatalf("%s is not held", resource)
	}
	return l
}
