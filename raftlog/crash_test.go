package raftlog

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Environment variables of the crash test. crashDirEnv is set only for the
// child process; crashItersEnv asks for a longer run.
const (
	crashDirEnv   = "RAFTLOG_CRASH_DIR"
	crashSeedEnv  = "RAFTLOG_CRASH_SEED"
	crashItersEnv = "RAFTLOG_CRASH_ITERS"
)

// TestCrashKeepsEveryAcknowledgedEntry starts a child process that saves
// batches in a loop and prints the last index of each batch once Save has
// returned, SIGKILLs it at a random acknowledgement, and reopens the log.
// The log must reopen as a consecutive run of the entries written, end at or
// after the last acknowledged index, and carry the HardState saved in the
// same transaction as its last entry (whose Commit equals that entry's index).
func TestCrashKeepsEveryAcknowledgedEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs a child process: skipped under -short (make test-short); make test runs it")
	}
	iters := 20
	if v := os.Getenv(crashItersEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", crashItersEnv, v, err)
		}
		iters = n
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < iters && time.Now().Before(deadline); i++ {
		killAfter := 1 + rng.IntN(300)
		acked := runCrashChild(t, t.TempDir(), rng.Uint64(), killAfter)
		t.Run(fmt.Sprintf("iter%d", i), func(t *testing.T) { checkAfterCrash(t, acked) })
	}
}

// TestCrashChild is the child side of TestCrashKeepsEveryAcknowledgedEntry;
// run on its own it skips.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("runs only as the crash test's child process")
	}
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	if seed%2 == 1 {
		// Half the children write small segments, so that kills also land
		// while a segment is cut or deleted by compaction.
		segmentSizeLimit = 8 << 10
	}
	if err := crashChildLoop(dir, rand.New(rand.NewPCG(seed, 1)), os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// crashChildLoop saves forever (until killed). Every batch also rewrites a
// few already-stored entries with identical content and now and then
// compacts, so truncation and deletion are in flight when the kill lands.
func crashChildLoop(dir string, rng *rand.Rand, out io.Writer) error {
	s, err := Open(dir, testID)
	if err != nil {
		return err
	}
	defer s.Close()
	last, _ := s.LastIndex()
	for {
		n := uint64(1 + rng.IntN(32))
		start := last + 1 - min(uint64(rng.IntN(3)), last)
		next := last + n
		if err := s.Save(hardState(1, 1, next), entries(start, next+1, 1), nil); err != nil {
			return err
		}
		last = next
		if _, err := fmt.Fprintf(out, "%d\n", last); err != nil {
			return err
		}
		if rng.IntN(20) == 0 && last > 50 {
			if err := s.Compact(last - 40); err != nil {
				return err
			}
		}
	}
}

// runCrashChild runs the child in dir, kills it after killAfter
// acknowledgements, and returns the dir and every index it acknowledged
// (including those printed between the decision and the kill).
func runCrashChild(t *testing.T, dir string, seed uint64, killAfter int) crashResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashSeedEnv+"="+strconv.FormatUint(seed, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	res := crashResult{dir: dir}
	var other bytes.Buffer
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		i, err := strconv.ParseUint(sc.Text(), 10, 64)
		if err != nil {
			other.WriteString(sc.Text() + "\n") // test framework output
			continue
		}
		res.acked = max(res.acked, i)
		res.count++
		if !killed && res.count >= killAfter {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			killed = true
		}
	}
	werr := cmd.Wait()
	if !killed {
		t.Fatalf("child exited on its own (%v): %s%s", werr, other.String(), stderr.String())
	}
	return res
}

type crashResult struct {
	dir   string
	acked uint64 // highest index whose Save returned
	count int    // acknowledgements read
}

func checkAfterCrash(t *testing.T, res crashResult) {
	s := mustOpen(t, res.dir)
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if last < res.acked {
		t.Fatalf("log ends at %d, but %d was acknowledged", last, res.acked)
	}
	ents, err := s.Entries(first, last+1, ^uint64(0))
	if err != nil {
		t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
	}
	for k, e := range ents {
		if e.GetIndex() != first+uint64(k) || !bytes.Equal(e.GetData(), payload(e.GetIndex(), 1)) {
			t.Fatalf("entry at position %d is %v, want index %d with its payload", k, e, first+uint64(k))
		}
	}
	checkHardStateMatches(t, s, last)
}

// checkHardStateMatches checks the HardState was saved atomically with the
// last entry: the child saves Commit equal to the batch's last index.
func checkHardStateMatches(t *testing.T, s *Storage, last uint64) {
	hs, _, err := s.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	want := hardState(1, 1, last)
	if hs.GetTerm() != want.GetTerm() || hs.GetVote() != want.GetVote() || hs.GetCommit() != want.GetCommit() {
		t.Fatalf("HardState %v, want %v (saved with entry %d)", hs, want, last)
	}
}
