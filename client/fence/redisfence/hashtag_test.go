package redisfence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/redisfence"
	"github.com/leased/leased/client/internal/servicetest"
)

const clusterAddrEnv = "LEASED_TEST_REDIS_CLUSTER_ADDR"

// keySlot is Redis Cluster's key slot (the cluster specification's
// HASH_SLOT): CRC16-XMODEM of the key's hash tag, or of the whole key when
// it has none, modulo 16384.
func keySlot(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// TestKeySlotMatchesRedis checks keySlot against the values the Redis
// documentation gives for CLUSTER KEYSLOT, so that the slot tests below
// compute what a cluster would.
func TestKeySlotMatchesRedis(t *testing.T) {
	for key, want := range map[string]uint16{
		"somekey":       11058,
		"foo{hash_tag}": 2515,
		"{hash_tag}":    2515,
		"123456789":     0x31C3 % 16384, // CRC16-XMODEM check value
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if keySlot("foo{}{bar}") == keySlot("bar") {
		t.Errorf("an empty hash tag must not select the next one")
	}
}

// TestHashTagPutsAResourceInOneSlot checks the Redis Cluster advice of the
// package docs with names the leased server accepts: with WithHashTag, the
// fence key of a resource and its data keys built with Tag share a slot.
func TestHashTagPutsAResourceInOneSlot(t *testing.T) {
	tagged := redisfence.New(nil, redisfence.WithHashTag())
	plain := redisfence.New(nil)
	resources := []string{"order-42", "jobs/nightly", "a", "tenant:7/db@eu=1+x.y_z"}
	apart := 0
	for _, r := range resources {
		key := tagged.Key(r)
		if want := redisfence.DefaultKeyPrefix + "{" + r + "}"; key != want {
			t.Errorf("Key(%q) = %q, want %q", r, key, want)
		}
		for _, data := range []string{redisfence.Tag(r), redisfence.Tag(r) + ":state", "app:" + redisfence.Tag(r) + ":log"} {
			if keySlot(key) != keySlot(data) {
				t.Errorf("resource %q: fence key %q in slot %d, data key %q in slot %d",
					r, key, keySlot(key), data, keySlot(data))
			}
		}
		if keySlot(plain.Key(r)) != keySlot(redisfence.Tag(r)+":state") {
			apart++
		}
	}
	if apart == 0 {
		t.Errorf("without WithHashTag every fence key shared its data's slot: the test proves nothing")
	}
}

func TestHashTagRefusesBraces(t *testing.T) {
	rdb, p := newClient(t)
	ctx := t.Context()
	f := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"), redisfence.WithHashTag())
	for _, r := range []string{"{order-42}", "a}b", "x{"} {
		if err := f.Write(ctx, r, 1, redisfence.Set(p+"k", "v")); !errors.Is(err, fence.ErrInvalidResource) {
			t.Errorf("Write(%q) = %v, want ErrInvalidResource", r, err)
		}
		if _, err := f.Highest(ctx, r); !errors.Is(err, fence.ErrInvalidResource) {
			t.Errorf("Highest(%q) = %v, want ErrInvalidResource", r, err)
		}
	}
	bad := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"{fence}:"), redisfence.WithHashTag())
	if err := bad.Write(ctx, "r", 1, redisfence.Set(p+"k", "v")); err == nil {
		t.Errorf("Write with a prefix holding braces succeeded")
	}
	if n := rdb.Exists(ctx, p+"k").Val(); n != 0 {
		t.Errorf("a refused write left its data behind")
	}
}

// TestHashTagWrite runs a fenced write with WithHashTag on the test Redis:
// the token lands at the tagged key, and the fence works as without it.
func TestHashTagWrite(t *testing.T) {
	rdb, p := newClient(t)
	ctx := t.Context()
	f := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"), redisfence.WithHashTag())
	state := p + redisfence.Tag("order-42") + ":state"
	if err := f.Write(ctx, "order-42", 7, redisfence.Set(state, "paid")); err != nil {
		t.Fatal(err)
	}
	if got := rdb.Get(ctx, p+"fence:{order-42}").Val(); got != "7" {
		t.Errorf("token at %q = %q, want 7", p+"fence:{order-42}", got)
	}
	var stale *fence.StaleTokenError
	if err := f.Write(ctx, "order-42", 6, redisfence.Set(state, "refunded")); !errors.As(err, &stale) || stale.Highest != 7 {
		t.Errorf("token 6 after 7 = %v, want stale with highest 7", err)
	}
	if got := rdb.Get(ctx, state).Val(); got != "paid" {
		t.Errorf("%s = %q, want paid", state, got)
	}
	if got, err := f.Highest(ctx, "order-42"); err != nil || got != 7 {
		t.Errorf("Highest = %d, %v; want 7", got, err)
	}
}

// TestHashTagOnRedisCluster writes through a *redis.ClusterClient to a
// one-node Redis Cluster, which checks slots as a big one does: with
// WithHashTag a write of a resource and its Tag data keys goes through;
// without it, the same write is refused with CROSSSLOT and writes nothing.
func TestHashTagOnRedisCluster(t *testing.T) {
	addr := servicetest.Require(t, clusterAddrEnv, "Redis Cluster")
	ctx := t.Context()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
	t.Cleanup(func() { _ = rdb.Close() })
	p := fmt.Sprintf("leasedtest:%d:%d:", runID, prefixSeq.Add(1))
	state := p + redisfence.Tag("order-42") + ":state"
	t.Cleanup(func() {
		_ = rdb.Del(context.Background(), state).Err()
		_ = rdb.Del(context.Background(), p+"fence:{order-42}").Err()
	})

	plain := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"))
	err := plain.Write(ctx, "order-42", 3, redisfence.Set(state, "paid"))
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Errorf("write without WithHashTag = %v, want CROSSSLOT", err)
	}
	if n := rdb.Exists(ctx, state).Val(); n != 0 {
		t.Errorf("the refused cross-slot write left its data behind")
	}

	tagged := redisfence.New(rdb, redisfence.WithKeyPrefix(p+"fence:"), redisfence.WithHashTag())
	if err := tagged.Write(ctx, "order-42", 3, redisfence.Set(state, "paid")); err != nil {
		t.Fatalf("write with WithHashTag: %v", err)
	}
	var stale *fence.StaleTokenError
	if err := tagged.Write(ctx, "order-42", 2, redisfence.Set(state, "refunded")); !errors.As(err, &stale) {
		t.Errorf("token 2 after 3 = %v, want stale", err)
	}
	if got := rdb.Get(ctx, state).Val(); got != "paid" {
		t.Errorf("%s = %q, want paid", state, got)
	}
	if got, err := tagged.Highest(ctx, "order-42"); err != nil || got != 3 {
		t.Errorf("Highest = %d, %v; want 3", got, err)
	}
}
