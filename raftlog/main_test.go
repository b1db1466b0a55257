package raftlog

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// Tests open thousands of logs; a smaller preallocation keeps their disk
	// traffic down and exercises growing a segment more often. Benchmarks
	// keep the production size.
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		preallocChunk = 64 << 10
	}
	goleak.VerifyTestMain(m)
}
