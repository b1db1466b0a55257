package raftnode

import (
	"errors"
	"log/slog"
	"slices"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// hostOn builds a raftHost on a fresh RawNode with voters 1..voters, this node 1, on a MemoryStorage
// written synchronously (persist handles the Readys). refused records the proposals raft dropped.
func hostOn(t *testing.T, voters int) (h *raftHost, ms *raft.MemoryStorage, persist func(), refused map[uint64]error) {
	t.Helper()
	ms = raft.NewMemoryStorage()
	rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: ms,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, DisableProposalForwarding: true,
		Logger: NewRaftLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	var peers []raft.Peer
	for id := range voters {
		peers = append(peers, raft.Peer{ID: uint64(id + 1)})
	}
	if err := rn.Bootstrap(peers); err != nil {
		t.Fatal(err)
	}
	refused = map[uint64]error{}
	h = newRaftHost(rn, 1, make(chan struct{}), func(id uint64, err error) { refused[id] = err })
	persist = func() {
		for rn.HasReady() {
			rd := rn.Ready()
			if !raft.IsEmptyHardState(rd.HardState) {
				if err := ms.SetHardState(rd.HardState); err != nil {
					t.Fatal(err)
				}
			}
			if err := ms.Append(rd.Entries); err != nil {
				t.Fatal(err)
			}
			rn.Advance(rd)
		}
	}
	persist()
	return h, ms, persist, refused
}

// TestLessorCommandOfAnEarlierTermIsDroppedWhereItIsStepped: a lessor command waits in the proposal queue
// while this node loses leadership and wins it back in a later term; the loop, stepping it, drops it (its
// remainders may predate renewals another leader acknowledged meanwhile). A command of the current term,
// and a client's, in the same batch, reach the log; nobody is told of a refusal (nobody waits for a
// lessor command).
func TestLessorCommandOfAnEarlierTermIsDroppedWhereItIsStepped(t *testing.T) {
	h, ms, persist, refused := hostOn(t, 1)
	if err := h.rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	persist()
	st := h.rn.BasicStatus()
	if st.RaftState != raft.StateLeader {
		t.Fatalf("a single voter did not win its campaign: %v", st.RaftState)
	}
	term := st.GetTerm()
	before, err := ms.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	h.pending = append(h.pending,
		Proposal{Data: []byte("stale"), Term: term - 1},
		Proposal{Data: []byte("current"), Term: term},
		Proposal{Data: []byte("client"), ID: 9})
	h.intake(true)
	persist()
	got := appendedSince(t, ms, before)
	if want := []string{"current", "client"}; !slices.Equal(got, want) {
		t.Fatalf("entries appended: %q, want %q", got, want)
	}
	if len(refused) != 0 {
		t.Fatalf("refusals reported: %v", refused)
	}
	if len(h.pending) != 0 {
		t.Fatalf("%d proposals left pending after the batch was stepped", len(h.pending))
	}
}

// TestProposalRaftDropsIsRefusedToItsProposer: a follower that knows no leader drops a proposal (this
// node forwards none, DisableProposalForwarding); the proposer hears raft's ErrProposalDropped through the
// refusal callback, which tells it that the command never entered the log.
func TestProposalRaftDropsIsRefusedToItsProposer(t *testing.T) {
	h, _, persist, refused := hostOn(t, 3)
	h.pending = append(h.pending, Proposal{Data: []byte("a"), ID: 7}, Proposal{Data: []byte("b")})
	h.intake(true)
	persist()
	if err := refused[7]; !errors.Is(err, raft.ErrProposalDropped) {
		t.Fatalf("proposal 7: refused with %v, want ErrProposalDropped", err)
	}
	if len(refused) != 1 {
		t.Fatalf("refusals %v: want only proposal 7's (the other has no proposer)", refused)
	}
}

// appendedSince returns the data of the normal, non-empty entries the log holds after index from.
func appendedSince(t *testing.T, ms *raft.MemoryStorage, from uint64) []string {
	t.Helper()
	last, err := ms.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	ents, err := ms.Entries(from+1, last+1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.GetType() == raftpb.EntryType_EntryNormal && len(e.GetData()) > 0 {
			out = append(out, string(e.GetData()))
		}
	}
	return out
}
