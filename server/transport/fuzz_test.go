package transport

import (
	"context"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
)

// FuzzDeliverPeerBatch feeds arbitrary bytes, as a peer's RaftBatch, to the receiving side: it must reject
// or deliver without panicking, and deliver only messages addressed as the batch says.
func FuzzDeliverPeerBatch(f *testing.F) {
	good := func(msgs ...*raftpb.Message) []byte {
		b := &wirepb.RaftBatch{ClusterId: 7, From: 2, To: 1}
		for _, m := range msgs {
			raw, _ := proto.Marshal(m)
			b.Messages = append(b.Messages, raw)
		}
		out, _ := proto.Marshal(b)
		return out
	}
	typ := raftpb.MessageType_MsgApp
	from, to, term := uint64(2), uint64(1), uint64(3)
	f.Add(good(&raftpb.Message{Type: &typ, From: &from, To: &to, Term: &term}))
	f.Add(good())
	f.Add([]byte{0x08, 0x07, 0x10, 0x02})
	f.Fuzz(func(t *testing.T, data []byte) {
		b := new(wirepb.RaftBatch)
		if err := proto.Unmarshal(data, b); err != nil {
			return
		}
		r := newFakeRaft()
		tr, err := New(Config{ClusterID: 7, LocalID: 1, Raft: r})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		_ = (&service{t: tr}).deliver(context.Background(), b, 0)
		r.mu.Lock()
		defer r.mu.Unlock()
		for sender, msgs := range r.got {
			for _, m := range msgs {
				if sender != b.GetFrom() || m.GetTo() != 1 {
					t.Fatalf("delivered a message from %d to %d out of a batch from %d to %d", m.GetFrom(), m.GetTo(), b.GetFrom(), b.GetTo())
				}
			}
		}
	})
}

// FuzzDeliverAuthenticatedBatch is FuzzDeliverPeerBatch on a stream whose certificate names member 2:
// whatever the bytes say, only messages from member 2 reach raft.
func FuzzDeliverAuthenticatedBatch(f *testing.F) {
	typ := raftpb.MessageType_MsgHeartbeat
	for _, from := range []uint64{2, 3} {
		to, term := uint64(1), ^uint64(0)
		raw, _ := proto.Marshal(&raftpb.Message{Type: &typ, From: &from, To: &to, Term: &term})
		b, _ := proto.Marshal(&wirepb.RaftBatch{ClusterId: 7, From: from, To: 1, Messages: [][]byte{raw}})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b := new(wirepb.RaftBatch)
		if err := proto.Unmarshal(data, b); err != nil {
			return
		}
		r := newFakeRaft()
		tr, err := New(Config{ClusterID: 7, LocalID: 1, Raft: r})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		_ = (&service{t: tr}).deliver(context.Background(), b, 2)
		r.mu.Lock()
		defer r.mu.Unlock()
		for sender, msgs := range r.got {
			if sender != 2 && len(msgs) > 0 {
				t.Fatalf("delivered %d messages from %d on member 2's stream", len(msgs), sender)
			}
		}
	})
}
