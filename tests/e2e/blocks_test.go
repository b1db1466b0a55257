package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/raftlog"
	"github.com/leased/leased/tests/internal/datadir"
	"github.com/leased/leased/tests/internal/proc"
)

// blockSize is the unit of damage: a file system block.
const blockSize = 4096

// blockDamage is one fault of the every-block test: a block of a file of the data dir zeroed, filled with
// junk or with one bit flipped.
type blockDamage struct {
	file  string // relative to the data dir
	block int
	kind  string // "zero", "junk", "flip"
	seed  uint64 // of the junk or the bit
}

func (d blockDamage) String() string {
	return fmt.Sprintf("%s block %d (offset %d) %s", d.file, d.block, d.block*blockSize, d.kind)
}

// apply damages the file in dir.
func (d blockDamage) apply(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, d.file)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk := b[d.block*blockSize : min((d.block+1)*blockSize, len(b))]
	rng := rand.New(rand.NewPCG(d.seed, 1))
	switch d.kind {
	case "zero":
		clear(blk)
	case "junk":
		for i := range blk {
			blk[i] = byte(rng.Uint32())
		}
	case "flip":
		bit := rng.IntN(len(blk) * 8)
		blk[bit/8] ^= 1 << (bit % 8)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies the regular files under src into dst (created).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := datadir.Copy(src, dst); err != nil {
		t.Fatal(err)
	}
}

// damages lists the faults for every block of every file in dir: each block holding data zeroed, filled
// with junk and bit-flipped, and of the blocks holding only zeros (the WAL's preallocated space, bbolt's
// free pages) a sample of up to zeroSample per file filled with junk and bit-flipped.
func damages(t *testing.T, dir string, rng *rand.Rand, zeroSample int) []blockDamage {
	t.Helper()
	var out []blockDamage
	files, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	files = append(files, filepath.Join(dir, raftlog.FileName), filepath.Join(dir, raftlog.AckFileName))
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, path)
		var zeros []int
		for blk := 0; blk*blockSize < len(b); blk++ {
			data := b[blk*blockSize : min((blk+1)*blockSize, len(b))]
			if bytes.Count(data, []byte{0}) == len(data) {
				zeros = append(zeros, blk)
				continue
			}
			for _, kind := range []string{"zero", "junk", "flip"} {
				out = append(out, blockDamage{rel, blk, kind, rng.Uint64()})
			}
		}
		rng.Shuffle(len(zeros), func(i, j int) { zeros[i], zeros[j] = zeros[j], zeros[i] })
		for _, blk := range zeros[:min(zeroSample, len(zeros))] {
			for _, kind := range []string{"junk", "flip"} {
				out = append(out, blockDamage{rel, blk, kind, rng.Uint64()})
			}
		}
	}
	return out
}

// blocksSeed is LEASED_BLOCKS_SEED, or a fresh seed (logged, so a run can be repeated).
func blocksSeed(t *testing.T) uint64 {
	if s := os.Getenv("LEASED_BLOCKS_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LEASED_BLOCKS_SEED: %v", err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// TestEveryBlockOfEveryFile damages a stopped node's data dir one 4 KiB block at a time, the way the CORDS
// study did ("Redundancy Does Not Imply Fault Tolerance", FAST 2017): every block holding data of every
// file zeroed, filled with junk and bit-flipped, and a sample of the blocks holding zeros. Each damaged
// copy is opened as the node would open it: it must be refused with an error naming the damaged file, or
// hold every entry, the hard state and the snapshot of the undamaged copy (every write of the stopped node
// returned). Then the damaged copies are started, one at a time, as the node beside the two healthy
// ones (as many as 90 s allow, in a seeded order): it exits 1 with a message naming the file and the
// runbook, or it serves, and every acknowledged grant is still there with its token, on the cluster and
// on that node. LEASED_BLOCKS_SEED repeats a run's samples and order.
func TestEveryBlockOfEveryFile(t *testing.T) {
	// Snapshots and compactions every 100 entries, so that raft.db holds snapshot data and the WAL a
	// compacted log.
	c := newCluster(t, 3, "--snapshot-entries=100", "--snapshot-catchup=50")
	seed := blocksSeed(t)
	t.Logf("seed %d (repeat with LEASED_BLOCKS_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0xb10c))
	r := newRetrier(c, 0)
	grants := map[string]uint64{}
	for i := range 300 {
		res := fmt.Sprintf("blocks/r%d", i)
		resp, _, err := r.acquire(res, "holder", fmt.Sprintf("req-%d", i), 10*time.Minute)
		if err != nil {
			t.Fatalf("acquire %s: %v", res, err)
		}
		grants[res] = resp.GetLease().GetToken()
	}
	ld, _ := c.waitLeader(10*time.Second, -1)
	victim := (ld + 1) % len(c.Nodes)
	node := c.Nodes[victim]
	c.eventually(10*time.Second, node.Name+" applying every grant", func() bool {
		st, err := c.status(victim)
		return err == nil && st.GetAppliedIndex() >= maxToken(grants)
	})
	if code := c.stop(victim); code != 0 {
		t.Fatalf("%s exited %d after SIGTERM", node.Name, code)
	}
	pristine := filepath.Join(t.TempDir(), "pristine")
	copyDir(t, node.DataDir, pristine)
	ref := filepath.Join(t.TempDir(), "ref")
	copyDir(t, pristine, ref)
	want, err := datadir.Read(ref)
	if err != nil {
		t.Fatalf("the undamaged copy does not open: %v", err)
	}

	all := damages(t, pristine, rng, 8)
	refused, whole := 0, 0
	start := time.Now()
	for _, d := range all {
		dir := filepath.Join(t.TempDir(), "d")
		copyDir(t, pristine, dir)
		d.apply(t, dir)
		got, err := datadir.Read(dir)
		switch {
		case err != nil:
			if !errors.Is(err, raftlog.ErrCorrupt) || !strings.Contains(err.Error(), filepath.Join(dir, d.file)) {
				t.Errorf("%v: Open: %v; want a refusal naming the file", d, err)
			}
			refused++
		case got.Lacks(want) != "":
			t.Errorf("%v: opened with %s", d, got.Lacks(want))
		default:
			whole++
		}
		_ = os.RemoveAll(dir)
	}
	t.Logf("%d damaged copies opened in %v: %d refused naming the file, %d whole", len(all), time.Since(start).Round(time.Millisecond), refused, whole)
	if t.Failed() {
		t.FailNow()
	}

	// As many as fit in the time budget (all of them, for a data dir this small), in a seeded order.
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	deadline := time.Now().Add(90 * time.Second)
	started := 0
	for _, d := range all {
		if time.Now().After(deadline) {
			break
		}
		started++
		t.Run(strings.NewReplacer("/", "-", " ", "_").Replace(d.String()), func(t *testing.T) {
			if err := os.RemoveAll(node.DataDir); err != nil {
				t.Fatal(err)
			}
			copyDir(t, pristine, node.DataDir)
			d.apply(t, node.DataDir)
			startDamaged(t, c, victim, d, grants)
		})
	}
	t.Logf("%d of the %d damaged copies started as %s beside the healthy nodes", started, len(all), node.Name)
	for res, tok := range grants {
		if l, err := r.get(res); err != nil || l.GetToken() != tok {
			t.Errorf("%s on the cluster: %v, %v; want token %d", res, l, err, tok)
		}
	}
}

// startDamaged starts node i on its damaged data dir beside the healthy ones: it must exit 1 naming the
// damaged file and the runbook, or serve every grant with its token once caught up. It leaves the node
// stopped.
func startDamaged(t *testing.T, c *cluster, i int, d blockDamage, grants map[string]uint64) {
	n := c.Nodes[i]
	logStart := n.LogSize()
	c.Start(i)
	var st *leasepb.StatusResponse
	if err := proc.Poll(20*time.Second, func() bool {
		if !c.Running(i) {
			return true
		}
		s, err := c.status(i)
		if err == nil && s.GetAppliedIndex() >= maxToken(grants) {
			st = s
			return true
		}
		return false
	}); err != nil {
		c.Kill(i)
		t.Fatalf("%v: the node neither refused nor caught up: %v\n%s", d, err, n.LogFrom(logStart))
	}
	if st == nil {
		code := c.Stop(i, syscall.SIGTERM, time.Second)
		out := n.LogFrom(logStart)
		if code != 1 || !strings.Contains(out, filepath.Join(n.DataDir, d.file)) || !strings.Contains(out, "docs/operations.md") {
			t.Fatalf("%v: exited %d; want 1 with a message naming %s and the runbook:\n%s", d, code, d.file, out)
		}
		t.Logf("%v: refused", d)
		return
	}
	defer func() {
		if code := c.stop(i); code != 0 {
			t.Errorf("%v: exited %d after SIGTERM", d, code)
		}
	}()
	for res, tok := range grants {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := c.Leases(i).Get(ctx, &leasepb.GetRequest{Resource: res, Serializable: true})
		cancel()
		if err != nil || resp.GetLease().GetToken() != tok {
			t.Errorf("%v: %s on the damaged node: %v, %v; want token %d", d, res, resp.GetLease(), err, tok)
		}
	}
	t.Logf("%v: served, every grant there", d)
}

func maxToken(grants map[string]uint64) uint64 {
	var m uint64
	for _, tok := range grants {
		m = max(m, tok)
	}
	return m
}
