package redisfence_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/fencetest"
	"github.com/leased/leased/client/fence/redisfence"
	"github.com/leased/leased/client/internal/servicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const addrEnv = "LEASED_TEST_REDIS_ADDR"

// prefixSeq and runID make key prefixes unique per test and per run, so
// runs against a shared server do not collide.
var (
	prefixSeq atomic.Int64
	runID     = time.Now().UnixNano() % 1e9
)

// newClient connects to the test Redis and deletes the keys under a fresh
// prefix, which it returns, when the test ends.
func newClient(t *testing.T) (*redis.Client, string) {
	t.Helper()
	addr := servicetest.Require(t, addrEnv, "Redis")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		_ = rdb.Close()
		t.Fatalf("connect to Redis at %s: %v", addr, err)
	}
	prefix := fmt.Sprintf("leasedtest:%d:%d:", runID, prefixSeq.Add(1))
	t.Cleanup(func() {
		deleteKeys(t, rdb, prefix)
		_ = rdb.Close()
	})
	return rdb, prefix
}

func deleteKeys(t *testing.T, rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Errorf("scan test keys: %v", err)
	}
	for chunk := range slices.Chunk(keys, 500) {
		_ = rdb.Del(ctx, chunk...).Err()
	}
}

func TestConformance(t *testing.T) {
	servicetest.Require(t, addrEnv, "Redis") // skip once, not once per case
	fencetest.Run(t, newHarness)
}

// harness appends to a list per resource with RPUSH. Its failing write is
// an RPUSH followed by an HSET of the same list, which the script must
// reject before writing anything: Redis has no rollback. Reopen closes the
// client and connects again.
type harness struct {
	addr, prefix string
	mu           sync.RWMutex
	rdb          *redis.Client
	fence        *redisfence.Fence
}

func newHarness(t *testing.T) fencetest.Harness {
	admin, prefix := newClient(t) // cleans up the keys, outlives reopens
	h := &harness{addr: admin.Options().Addr, prefix: prefix}
	h.connect(redis.NewClient(&redis.Options{Addr: h.addr}))
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		_ = h.rdb.Close()
	})
	return h
}

func (h *harness) connect(rdb *redis.Client) {
	h.rdb = rdb
	h.fence = redisfence.New(rdb, redisfence.WithKeyPrefix(h.prefix+"fence:"))
}

func (h *harness) Reopen(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.rdb.Close(); err != nil {
		return err
	}
	h.connect(redis.NewClient(&redis.Options{Addr: h.addr}))
	return nil
}

func (h *harness) historyKey(resource string) string { return h.prefix + "history:" + resource }

func (h *harness) Append(ctx context.Context, resource string, token uint64, value string) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Write(ctx, resource, token, redisfence.RPush(h.historyKey(resource), value))
}

func (h *harness) AppendThenFail(ctx context.Context, resource string, token uint64, value string, failure error) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	key := h.historyKey(resource)
	err := h.fence.Write(ctx, resource, token, redisfence.RPush(key, value), redisfence.HSet(key, "f", "v"))
	if err == nil || errors.Is(err, fence.ErrStaleToken) {
		return err
	}
	return errors.Join(failure, err)
}

func (h *harness) Claim(ctx context.Context, resource string, token uint64) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Claim(ctx, resource, token)
}

func (h *harness) History(ctx context.Context, resource string) ([]string, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	hist, err := h.rdb.LRange(ctx, h.historyKey(resource), 0, -1).Result()
	if len(hist) == 0 {
		hist = nil
	}
	return hist, err
}

func (h *harness) Highest(ctx context.Context, resource string) (uint64, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Highest(ctx, resource)
}

func TestAllowlistedCommands(t *testing.T) {
	rdb, p := newClient(t)
	ctx := t.Context()
	f := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"))
	err := f.Write(ctx, "r", 1,
		redisfence.Set(p+"s", "v1"),
		redisfence.Set(p+"gone", "x"),
		redisfence.Del(p+"gone"),
		redisfence.HSet(p+"h", "a", 1, "b", 2),
		redisfence.HDel(p+"h", "b"),
		redisfence.RPush(p+"l", "x", "y"),
		redisfence.LPush(p+"l", "w"),
		redisfence.SAdd(p+"set", "m1", "m2"),
		redisfence.SRem(p+"set", "m1"),
		redisfence.Del(p+"s"),
		redisfence.HSet(p+"s", "now", "a hash"), // DEL then HSET: the type check follows along
	)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		got  any
		want any
	}{
		{rdb.Exists(ctx, p+"gone").Val(), int64(0)},
		{rdb.HGetAll(ctx, p+"h").Val(), map[string]string{"a": "1"}},
		{rdb.LRange(ctx, p+"l", 0, -1).Val(), []string{"w", "x", "y"}},
		{rdb.SMembers(ctx, p+"set").Val(), []string{"m2"}},
		{rdb.HGetAll(ctx, p+"s").Val(), map[string]string{"now": "a hash"}},
	}
	for i, c := range checks {
		if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("check %d: got %v, want %v", i, c.got, c.want)
		}
	}
}

func TestInvalidCommandsWriteNothing(t *testing.T) {
	rdb, p := newClient(t)
	ctx := t.Context()
	f := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"))
	bad := []redisfence.Command{
		{Name: "FLUSHALL"},
		{Name: "INCR", Keys: []string{p + "k"}},
		{Name: "SET", Keys: []string{p + "k"}, Args: []any{"v", "PX", 10}},
		{Name: "SET", Keys: []string{p + "k", p + "k2"}, Args: []any{"v"}},
		{Name: "DEL"},
		{Name: "HSET", Keys: []string{p + "k"}, Args: []any{"odd"}},
		redisfence.RPush(p + "k"),
		redisfence.Set(p+"fence:r", "999"),           // the token key itself
		redisfence.Del(p + "fence:other"),            // another token key
		redisfence.SAdd(p+"k", make([]any, 2000)...), // beyond MaxCommandItems
	}
	for i, c := range bad {
		err := f.Write(ctx, "r", 5, redisfence.Set(p+"written", "x"), c)
		if !errors.Is(err, redisfence.ErrInvalidCommand) {
			t.Errorf("command %d (%s): err = %v, want ErrInvalidCommand", i, c.Name, err)
		}
	}
	expectUntouched(t, rdb, f, p)
}

func TestWrongTypeWritesNothing(t *testing.T) {
	rdb, p := newClient(t)
	ctx := t.Context()
	f := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"))
	if err := rdb.Set(ctx, p+"str", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []redisfence.Command{
		redisfence.HSet(p+"str", "f", "v"),
		redisfence.RPush(p+"str", "v"),
		redisfence.SRem(p+"str", "v"),
	} {
		err := f.Write(ctx, "r", 5, redisfence.Set(p+"written", "x"), c)
		if !errors.Is(err, redisfence.ErrWrongType) {
			t.Errorf("%s on a string: err = %v, want ErrWrongType", c.Name, err)
		}
	}
	expectUntouched(t, rdb, f, p)
}

func TestCorruptTokenWritesNothing(t *testing.T) {
	rdb, p := newClient(t)
	ctx := t.Context()
	f := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"))
	for _, v := range []string{"abc", "007", "-1"} {
		if err := rdb.Set(ctx, f.Key("r"), v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := f.Write(ctx, "r", 5, redisfence.Set(p+"written", "x")); err == nil {
			t.Errorf("write over a corrupt token %q succeeded", v)
		}
	}
	if n := rdb.Exists(ctx, p+"written").Val(); n != 0 {
		t.Errorf("a rejected write left its data behind")
	}
}

func TestScriptCacheFlushFallsBackToEval(t *testing.T) {
	rdb, p := newClient(t)
	ctx := t.Context()
	f := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"))
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(ctx, "r", 1, redisfence.Set(p+"k", "v")); err != nil {
		t.Fatalf("write after SCRIPT FLUSH: %v", err)
	}
	if got := rdb.Get(ctx, p+"k").Val(); got != "v" {
		t.Errorf("k = %q, want v", got)
	}
}

// expectUntouched checks that no rejected write recorded a token or data.
func expectUntouched(t *testing.T, rdb *redis.Client, f *redisfence.Fence, p string) {
	t.Helper()
	ctx := t.Context()
	if got, err := f.Highest(ctx, "r"); err != nil || got != 0 {
		t.Errorf("Highest = %d, %v; want 0", got, err)
	}
	if n := rdb.Exists(ctx, p+"written", p+"k").Val(); n != 0 {
		t.Errorf("a rejected write left %d keys behind", n)
	}
}
