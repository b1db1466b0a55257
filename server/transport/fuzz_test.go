package transport

import (
	"bytes"
	"context"
	"io"
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
		_ = tr.deliver(context.Background(), b, 0)
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
		_ = tr.deliver(context.Background(), b, 2)
		r.mu.Lock()
		defer r.mu.Unlock()
		for sender, msgs := range r.got {
			if sender != 2 && len(msgs) > 0 {
				t.Fatalf("delivered %d messages from %d on member 2's stream", len(msgs), sender)
			}
		}
	})
}

// FuzzFrameReader reads arbitrary bytes as a link's frames: it must end with an error, never panic, and
// never return a payload over its limit.
func FuzzFrameReader(f *testing.F) {
	frame, _ := appendBatchFrame(nil, 7, 2, 1, []*raftpb.Message{msgApp(2, 1, 1, []byte("entry"))})
	f.Add(frame)
	f.Add(appendFrame(appendFrame(nil, framePing, nil), frameEnd, []byte{1, 2}))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := &frameReader{r: bytes.NewReader(data), limit: 64}
		for range len(data) + 1 {
			_, payload, err := fr.next()
			if err != nil {
				return
			}
			if len(payload) > fr.limit {
				t.Fatalf("payload of %d bytes over the limit of %d", len(payload), fr.limit)
			}
		}
		t.Fatal("more frames than bytes")
	})
}

// A batch frame decodes as the RaftBatch it encodes, message for message.
func TestBatchFrameRoundTrip(t *testing.T) {
	msgs := []*raftpb.Message{msgApp(2, 1, 5, []byte("x")), msg(raftpb.MsgHeartbeat, 2, 1, 0), msgApp(2, 1, 6, bytes.Repeat([]byte("y"), 100<<10))}
	frame, err := appendBatchFrame(nil, 7, 2, 1, msgs)
	if err != nil {
		t.Fatal(err)
	}
	frame = appendFrame(frame, framePing, nil)
	fr := &frameReader{r: bytes.NewReader(frame), limit: 1 << 20}
	kind, payload, err := fr.next()
	if err != nil || kind != frameBatch {
		t.Fatalf("first frame: kind %d, %v", kind, err)
	}
	b := &wirepb.RaftBatch{}
	if err := proto.Unmarshal(payload, b); err != nil {
		t.Fatal(err)
	}
	if b.GetClusterId() != 7 || b.GetFrom() != 2 || b.GetTo() != 1 || len(b.GetMessages()) != len(msgs) {
		t.Fatalf("batch header %d/%d/%d with %d messages", b.GetClusterId(), b.GetFrom(), b.GetTo(), len(b.GetMessages()))
	}
	for i, raw := range b.GetMessages() {
		m := &raftpb.Message{}
		if err := proto.Unmarshal(raw, m); err != nil || !proto.Equal(m, msgs[i]) {
			t.Fatalf("message %d: %v, %v", i, m, err)
		}
	}
	if kind, _, err := fr.next(); err != nil || kind != framePing {
		t.Fatalf("second frame: kind %d, %v", kind, err)
	}
	if _, _, err := fr.next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}
