package raftlog

import (
	"bytes"
	"errors"
	"sync"
	"testing"

	"go.etcd.io/raft/v3"
)

// TestReadersRunConcurrentlyWithTheWriter runs readers against a Storage
// while one goroutine saves and compacts, as a status page would next to
// the raft goroutine. Run under -race; readers must only ever see entries
// with the right payloads, or raft's compaction/unavailable errors.
func TestReadersRunConcurrentlyWithTheWriter(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := readOnce(s); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := uint64(1); i <= 2000; i += 10 {
		if err := s.Save(hardState(1, 1, i), entries(i, i+10, 1), nil); err != nil {
			t.Fatal(err)
		}
		if i%200 == 1 && i > 100 {
			if err := s.Compact(i - 50); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func readOnce(s *Storage) error {
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	_, _ = s.Term(last)
	if last < first {
		return nil
	}
	ents, err := s.Entries(first, last+1, 1<<16)
	if errors.Is(err, raft.ErrCompacted) || errors.Is(err, raft.ErrUnavailable) {
		return nil // the writer moved on between the calls
	}
	if err != nil {
		return err
	}
	for k, e := range ents {
		if e.GetIndex() != first+uint64(k) || !bytes.Equal(e.GetData(), payload(e.GetIndex(), 1)) {
			return errors.New("reader saw a wrong entry")
		}
	}
	return nil
}
