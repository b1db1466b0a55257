package leases

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
)

// recorder stands in for everyone a State tells: it logs each call, with the applied index at the time.
type recorder struct {
	s     *State
	calls []string
}

func (r *recorder) log(format string, args ...any) {
	r.calls = append(r.calls, fmt.Sprintf(format, args...)+fmt.Sprintf(" @%d", r.s.Applied()))
}

func (r *recorder) Applied(_ time.Time, res fsm.Result) { r.log("lessor %d", len(res.Events)) }
func (r *recorder) Reset(sm *fsm.FSM, _ time.Time)      { r.log("lessor reset %d", sm.Len()) }

type recWatch struct{ *recorder }

func (w recWatch) Publish(index uint64, events []fsm.Event) { w.log("watch %d", index) }
func (w recWatch) Reset(oldest uint64)                      { w.log("watch reset %d", oldest) }

type recQueue struct{ *recorder }

func (q recQueue) Applied(fsm.Result) { q.log("queue") }

func newTestState(t *testing.T, lim Limits) (*State, *recorder) {
	t.Helper()
	r := &recorder{}
	r.s = New(fsm.New(), 0, Config{
		Limits:  lim,
		Now:     time.Now,
		Lessor:  r,
		Watch:   recWatch{r},
		Queue:   recQueue{r},
		Metrics: func(fsm.Result) { r.log("metrics") },
		Audit:   func(index uint64, _ fsm.Result) { r.log("audit %d", index) },
		Answer:  func(id, index uint64, _ fsm.Result) { r.log("answer %d at %d", id, index) },
		ConfChange: func(e *raftpb.Entry) error {
			r.log("conf change %d", e.GetIndex())
			return nil
		},
	})
	return r.s, r
}

func acquireEntry(t *testing.T, index, proposalID uint64, resource, identity string) *raftpb.Entry {
	return commandEntry(t, index, &wirepb.Command{ProposalId: proposalID, Op: &wirepb.Command_Acquire{Acquire: &wirepb.AcquireCmd{
		Resource: resource, Holder: "h", TtlMs: 10_000, Identity: identity,
	}}})
}

// aclEntry lets alice and bob take leases.
func aclEntry(t *testing.T, index uint64) *raftpb.Entry {
	perms := []leasepb.Permission{leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE}
	return commandEntry(t, index, &wirepb.Command{Op: &wirepb.Command_SetAcl{SetAcl: &wirepb.SetAclCmd{Rules: []*leasepb.AclRule{
		{Identity: "alice", Permissions: perms}, {Identity: "bob", Permissions: perms},
	}}}})
}

func commandEntry(t *testing.T, index uint64, cmd *wirepb.Command) *raftpb.Entry {
	t.Helper()
	data, err := fsm.EncodeCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return &raftpb.Entry{Index: &index, Type: raftpb.EntryType_EntryNormal.Enum(), Data: data}
}

func entry(index uint64, typ raftpb.EntryType) *raftpb.Entry {
	return &raftpb.Entry{Index: &index, Type: typ.Enum()}
}

// Every listener hears of a command in a fixed order, and its proposer only once the applied index has
// moved past it; an entry already applied is skipped, and a conf change goes to the membership hook.
func TestApplyTellsTheListenersThenTheProposer(t *testing.T) {
	s, r := newTestState(t, Limits{QuotaBytes: 1 << 20, MaxLeases: 10, QuotaBytesPerIdentity: 1 << 20})
	ents := []*raftpb.Entry{
		entry(1, raftpb.EntryType_EntryNormal), // a new leader's empty entry
		acquireEntry(t, 2, 7, "a", ""),
		entry(3, raftpb.EntryType_EntryConfChangeV2),
	}
	if err := s.Apply(ents); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ents[1:2]); err != nil { // replayed: already in the state
		t.Fatal(err)
	}
	want := []string{
		"audit 1 @0",
		"lessor 1 @1", "watch 2 @1", "metrics @1", "audit 2 @1", "queue @1", "answer 7 at 2 @2",
		"conf change 3 @2",
	}
	if fmt.Sprint(r.calls) != fmt.Sprint(want) {
		t.Fatalf("calls\n%v\nwant\n%v", r.calls, want)
	}
	if s.Applied() != 3 {
		t.Fatalf("applied %d, want 3", s.Applied())
	}
	if err := s.WaitApplied(context.Background(), 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]*raftpb.Entry{entry(4, raftpb.EntryType(99))}); err == nil || s.Applied() != 3 {
		t.Fatalf("an entry of unknown type: err %v, applied %d", err, s.Applied())
	}
}

// Past --max-leases or --quota-bytes-per-identity a grant of a free resource is refused with the flag to
// raise; an acquire of a held resource passes.
func TestAdmitGrantRefusesFreeResourcesPastALimit(t *testing.T) {
	s, _ := newTestState(t, Limits{QuotaBytes: 1 << 20, MaxLeases: 1, QuotaBytesPerIdentity: 1 << 20})
	if err := s.AdmitGrant("a", ""); err != nil {
		t.Fatalf("under the limits: %v", err)
	}
	if err := s.Apply([]*raftpb.Entry{acquireEntry(t, 1, 0, "a", "")}); err != nil {
		t.Fatal(err)
	}
	if s.UsedBytes() <= 0 || s.QuotaFull() {
		t.Fatalf("used %d bytes, full %v", s.UsedBytes(), s.QuotaFull())
	}
	var lim *errs.Limit
	if err := s.AdmitGrant("b", ""); !errors.As(err, &lim) || lim.Flag != "--max-leases" {
		t.Fatalf("a free resource at --max-leases: %v", err)
	}
	if err := s.AdmitGrant("a", ""); err != nil {
		t.Fatalf("a held resource: %v", err)
	}

	s, _ = newTestState(t, Limits{QuotaBytes: 1 << 20, MaxLeases: 10, QuotaBytesPerIdentity: 1})
	if err := s.Apply([]*raftpb.Entry{aclEntry(t, 1), acquireEntry(t, 2, 0, "a", "alice")}); err != nil {
		t.Fatal(err)
	}
	if err := s.AdmitGrant("b", "alice"); !errors.As(err, &lim) || lim.Flag != "--quota-bytes-per-identity" {
		t.Fatalf("alice past her quota: %v", err)
	}
	if err := s.AdmitGrant("b", "bob"); err != nil {
		t.Fatalf("bob: %v", err)
	}
}

// A state machine from a snapshot replaces the old one; Restored starts the listeners and the size over
// from it and wakes those waiting for its index.
func TestRestoredStartsOverFromTheSnapshot(t *testing.T) {
	s, r := newTestState(t, Limits{QuotaBytes: 1 << 20, MaxLeases: 10, QuotaBytesPerIdentity: 1 << 20})
	src, _ := newTestState(t, Limits{QuotaBytes: 1 << 20, MaxLeases: 10, QuotaBytesPerIdentity: 1 << 20})
	if err := src.Apply([]*raftpb.Entry{acquireEntry(t, 1, 0, "a", ""), acquireEntry(t, 2, 0, "b", "")}); err != nil {
		t.Fatal(err)
	}
	var data []byte
	src.Read(func(sm *fsm.FSM) { data, _ = sm.Snapshot() })
	sm, err := fsm.Restore(data)
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() { woke <- s.WaitApplied(context.Background(), 2, nil) }()
	s.Replace(sm)
	s.Restored(2)
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	want := []string{"lessor reset 2 @2", "watch reset 3 @2"}
	if fmt.Sprint(r.calls) != fmt.Sprint(want) || s.UsedBytes() != src.UsedBytes() {
		t.Fatalf("calls %v (want %v), used %d bytes (want %d)", r.calls, want, s.UsedBytes(), src.UsedBytes())
	}
	var n int
	s.Read(func(sm *fsm.FSM) { n = sm.Len() })
	if n != 2 {
		t.Fatalf("%d leases after the restore, want 2", n)
	}
}
