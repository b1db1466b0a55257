package raftnode

import (
	"errors"
	"slices"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// recorder is a LocalStorage whose node records what it was asked to do, in order.
func recorder(persistErr, decodeErr error) (*LocalStorage[string], *[]string) {
	var calls []string
	l := NewLocalStorage(LocalStorageConfig[string]{
		Persist: func(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot, _ bool) error {
			calls = append(calls, "persist")
			return persistErr
		},
		Decode: func(data []byte) (string, error) {
			calls = append(calls, "decode")
			return string(data), decodeErr
		},
		Restore: func(_ *raftpb.Snapshot, sm string) error {
			calls = append(calls, "restore "+sm)
			return nil
		},
		Apply: func(ents []*raftpb.Entry) error {
			calls = append(calls, "apply")
			return persistErr
		},
		Deliver: func(resps []*raftpb.Message) { calls = append(calls, "deliver") },
	})
	return l, &calls
}

func appendWithSnapshot() *raftpb.Message {
	return &raftpb.Message{
		Type: raftpb.MsgStorageAppend.Enum(), To: new(raft.LocalAppendThread),
		Snapshot:  &raftpb.Snapshot{Data: []byte("state"), Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(7)), Term: new(uint64(2))}},
		Responses: []*raftpb.Message{{Type: raftpb.MsgStorageAppendResp.Enum()}},
	}
}

// TestAppendDeliversOnlyWhatIsDurable: an append's snapshot is decoded before anything is written,
// restored once it is durable, and the responses go out last; a write or a decode that fails delivers
// nothing (decision 8).
func TestAppendDeliversOnlyWhatIsDurable(t *testing.T) {
	l, calls := recorder(nil, nil)
	m := appendWithSnapshot()
	l.Begin(m)
	if got := l.Appending(); got != 7 {
		t.Fatalf("Appending = %d during the write of a snapshot at 7", got)
	}
	if err := l.Append(m, true); err != nil {
		t.Fatal(err)
	}
	if want := []string{"decode", "persist", "restore state", "deliver"}; !slices.Equal(*calls, want) {
		t.Fatalf("calls = %v, want %v", *calls, want)
	}
	if got := l.Appending(); got != 0 {
		t.Fatalf("Appending = %d after the write returned", got)
	}

	l, calls = recorder(errors.New("disk full"), nil)
	if err := l.Append(m, true); err == nil || slices.Contains(*calls, "deliver") || slices.Contains(*calls, "restore state") {
		t.Fatalf("a failed write: err %v, calls %v; want the error and nothing restored or delivered", err, *calls)
	}

	l, calls = recorder(nil, errors.New("bad data"))
	if err := l.Append(m, true); err == nil || !slices.Equal(*calls, []string{"decode"}) {
		t.Fatalf("an undecodable snapshot: err %v, calls %v; want the error and nothing written", err, *calls)
	}
}

// TestApplyDeliversAfterApplying: raft hears that entries are applied only once they are.
func TestApplyDeliversAfterApplying(t *testing.T) {
	m := &raftpb.Message{Type: raftpb.MsgStorageApply.Enum(), Entries: []*raftpb.Entry{{Index: new(uint64(3))}},
		Responses: []*raftpb.Message{{Type: raftpb.MsgStorageApplyResp.Enum()}}}
	l, calls := recorder(nil, nil)
	if err := l.Apply(m); err != nil || !slices.Equal(*calls, []string{"apply", "deliver"}) {
		t.Fatalf("err %v, calls %v; want apply, then deliver", err, *calls)
	}
	l, calls = recorder(errors.New("apply failed"), nil)
	if err := l.Apply(m); err == nil || !slices.Equal(*calls, []string{"apply"}) {
		t.Fatalf("a failed apply: err %v, calls %v; want the error and nothing delivered", err, *calls)
	}
}
