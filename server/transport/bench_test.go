package transport

import (
	"bytes"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// BenchmarkLinkMsgApp1KiB measures messages per second through one peer link over loopback gRPC:
// MsgApp messages carrying one 1 KiB entry each, handed to Send 64 at a time as a Ready loop would,
// with at most half a queue in flight so nothing is dropped.
func BenchmarkLinkMsgApp1KiB(b *testing.B) {
	const chunk = 64
	recv := startNode(b, 2, nil)
	recv.raft.countOnly = true
	send := startNode(b, 1, nil)
	connect(send, recv)
	window := send.tr.cfg.QueueSize / 2

	payload := bytes.Repeat([]byte("e"), 1024)
	msgs := make([]*raftpb.Message, chunk)
	for i := range msgs {
		msgs[i] = msgApp(1, 2, uint64(i+1), payload)
	}
	delivered := func() int { return recv.raft.count() + int(send.tr.Stats().Dropped) }

	b.SetBytes(int64(chunk * len(payload)))
	b.ResetTimer()
	start := time.Now()
	sent := 0
	for b.Loop() {
		for sent-delivered() > window {
			<-recv.raft.changed
		}
		send.tr.Send(msgs)
		sent += chunk
	}
	for delivered() < sent {
		<-recv.raft.changed
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if d := send.tr.Stats().Dropped; d > 0 {
		b.Fatalf("%d messages dropped", d)
	}
	s := send.tr.Stats()
	b.ReportMetric(float64(sent)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(s.Sent)/float64(s.Batches), "msgs/batch")
	b.ReportMetric(0, "ns/op")
}
