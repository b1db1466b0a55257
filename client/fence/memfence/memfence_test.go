package memfence_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/leased/leased/client/fence/fencetest"
	"github.com/leased/leased/client/fence/memfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Harness {
		return harness{memfence.New()}
	})
}

// harness keeps each resource's history under the key "history/<resource>",
// values separated by newlines.
type harness struct{ s *memfence.Store }

func historyKey(resource string) string { return "history/" + resource }

func appendTo(tx *memfence.Tx, resource, value string) {
	old, _ := tx.Get(historyKey(resource))
	tx.Put(historyKey(resource), append(old, value+"\n"...))
}

func (h harness) Append(ctx context.Context, resource string, token uint64, value string) error {
	return h.s.Write(ctx, resource, token, func(tx *memfence.Tx) error {
		appendTo(tx, resource, value)
		return nil
	})
}

func (h harness) AppendThenFail(ctx context.Context, resource string, token uint64, value string, failure error) error {
	return h.s.Write(ctx, resource, token, func(tx *memfence.Tx) error {
		appendTo(tx, resource, value)
		tx.Delete("unrelated")
		return failure
	})
}

func (h harness) Claim(ctx context.Context, resource string, token uint64) error {
	return h.s.Claim(ctx, resource, token)
}

func (h harness) History(_ context.Context, resource string) ([]string, error) {
	v, _ := h.s.Get(historyKey(resource))
	lines := strings.Split(string(v), "\n")
	return lines[:len(lines)-1], nil
}

func (h harness) Highest(_ context.Context, resource string) (uint64, error) {
	return h.s.Highest(resource), nil
}

func TestTxStagesReadsAndDeletes(t *testing.T) {
	s := memfence.New()
	ctx := context.Background()
	if err := s.Write(ctx, "r", 1, func(tx *memfence.Tx) error {
		tx.Put("a", []byte("1"))
		tx.Put("b", []byte("2"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "r", 2, func(tx *memfence.Tx) error {
		tx.Delete("a")
		if _, ok := tx.Get("a"); ok {
			t.Error("deleted key visible inside the tx")
		}
		if _, ok := tx.Get("b"); !ok {
			t.Error("committed key not visible inside the tx")
		}
		tx.Put("a", []byte("3"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Get("a"); string(v) != "3" {
		t.Errorf("a = %q, want 3", v)
	}
}
