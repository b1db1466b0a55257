package server_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/raftlog"
	"github.com/leased/leased/server/servertest"
)

// TestBootstrapEntriesIdenticalOnEveryFoundingNode: every founding node writes the bootstrap conf changes
// 1..n itself; raft's log matching requires them to be byte-identical (same index and term, same content).
func TestBootstrapEntriesIdenticalOnEveryFoundingNode(t *testing.T) {
	const size = 3
	c := servertest.Start(t, size, nil)
	c.Close()
	var (
		first     []byte
		firstEnts any
	)
	for i := range size {
		dir := c.Config(i).DataDir
		st, err := raftlog.Open(dir, raftlog.Identity{})
		if err != nil {
			t.Fatalf("open %s: %v", dir, err)
		}
		ents, err := st.Entries(1, size+1, 1<<30)
		_ = st.Close()
		if err != nil {
			t.Fatalf("read the bootstrap entries of %s: %v", dir, err)
		}
		var b []byte
		for _, e := range ents {
			eb, err := proto.MarshalOptions{Deterministic: true}.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, eb...)
		}
		if i == 0 {
			first, firstEnts = b, ents
		} else if !bytes.Equal(first, b) {
			t.Errorf("bootstrap entries 1..%d of %s differ from %s's:\n%v\nvs\n%v", size, c.Config(i).Name, c.Config(0).Name, ents, firstEnts)
		}
	}
}
