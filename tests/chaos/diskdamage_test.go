package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/leased/leased/raftlog"
	"github.com/leased/leased/tests/internal/datadir"
	"github.com/leased/leased/tests/internal/proc"
)

// The disk-damage nemesis (runConfig.DiskDamage, LEASED_CHAOS_DISK=1, make chaos DISK=1): stop a node
// (SIGTERM or SIGKILL), flip one byte of its newest WAL segment (inside its records), its raft.db or its
// ack file while it is down, and start it again. A copy of the damaged data dir, opened as the node opens it, must
// be refused naming the damaged file or hold everything the undamaged one held; and the node must refuse
// to start, exit 1 naming the damaged file, or start and serve. Anything else (a log that opens shorter, a
// node that does neither within refuseBound, a refusal that names no file) is a "disk" finding. A refused node is then mended as an operator's replacement would leave it, with the log it had
// (the byte flipped back), and rejoins. The promise itself (no acknowledged grant lost, no token issued
// twice) is what the I3 checker (durable grants after the full restart) and the I1/I2 checker (every
// grant in the applied event stream, every node's state) check at the end of the run.

// refuseBound bounds how long a damaged node may take to refuse or to answer.
const refuseBound = 10 * time.Second

// diskDamageNemesis damages node i's data dir while it is down; ld is the leader (-1 if none).
func (r *run) diskDamageNemesis(ctx context.Context, rng *rand.Rand, ld int) {
	i := rng.IntN(len(r.c.Nodes))
	n := r.c.Nodes[i]
	role := map[bool]string{true: "leader", false: "follower"}[i == ld]
	clean := rng.IntN(2) == 0
	if clean {
		r.stopNode(i)
	} else {
		r.c.Kill(i)
	}
	want, err := r.readCopy(n.DataDir)
	if err != nil {
		r.diskFinding("%s: its undamaged data dir does not open: %v", n.Name, err)
	}
	path, off, orig, err := flipByte(n.DataDir, rng)
	if err != nil {
		r.diskFinding("%s: %v", n.Name, err)
		r.restartAndRejoin(ctx, i)
		return
	}
	r.checkDamagedOpen(n.Name, n.DataDir, path, off, want)
	id := r.faultStart("disk-flip-"+role, i)
	defer r.faultEnd(id)
	logStart := n.LogSize()
	r.c.Start(i)
	refused, err := r.refusedOrServing(i)
	rel, _ := filepath.Rel(n.DataDir, path)
	how := map[bool]string{true: "stopped", false: "killed"}[clean]
	switch {
	case err != nil:
		r.diskFinding("%s (%s) with %s offset %d flipped: %v", n.Name, how, rel, off, err)
		r.c.Kill(i)
	case !refused:
		r.faultNote(id, nil, fmt.Sprintf("%s offset %d flipped (%s): served", rel, off, how))
		return
	default:
		code := r.c.Stop(i, syscall.SIGKILL, time.Second) // exited already: its exit code
		out := n.LogFrom(logStart)
		if code != 1 || !strings.Contains(out, path) {
			r.diskFinding("%s (%s) with %s offset %d flipped exited %d without naming the file: %s", n.Name, how, rel, off, code, lastLine(out))
		}
		r.faultNote(id, nil, fmt.Sprintf("%s offset %d flipped (%s): refused", rel, off, how))
	}
	if err := writeByte(path, off, orig); err != nil {
		r.diskFinding("%s: mend %s: %v", n.Name, rel, err)
	}
	r.restartAndRejoin(ctx, i)
}

// readCopy reads the raft log of a copy of dir (opening may write to it).
func (r *run) readCopy(dir string) (datadir.Log, error) {
	cp, err := os.MkdirTemp(r.dir, "disk-")
	if err != nil {
		return datadir.Log{}, err
	}
	defer os.RemoveAll(cp)
	if err := datadir.Copy(dir, cp); err != nil {
		return datadir.Log{}, err
	}
	l, err := datadir.Read(cp)
	if err != nil {
		// Name the files as they are in dir, not in the copy.
		return l, fmt.Errorf("%w [%s]", err, strings.ReplaceAll(err.Error(), cp, dir))
	}
	return l, nil
}

// checkDamagedOpen opens a copy of the damaged dir the way the node will: it must be refused naming the
// damaged file, or hold every entry, the hard state and the snapshot of want.
func (r *run) checkDamagedOpen(name, dir, path string, off int64, want datadir.Log) {
	got, err := r.readCopy(dir)
	rel, _ := filepath.Rel(dir, path)
	switch {
	case err != nil && (!errors.Is(err, raftlog.ErrCorrupt) || !strings.Contains(err.Error(), path)):
		r.diskFinding("%s with %s offset %d flipped: open: %v; want a refusal naming the file", name, rel, off, err)
	case err == nil && got.Lacks(want) != "":
		r.diskFinding("%s with %s offset %d flipped opens with %s: acknowledged records lost", name, rel, off, got.Lacks(want))
	}
}

// refusedOrServing waits until node i has exited (true) or answers Status (false), or refuseBound passes.
func (r *run) refusedOrServing(i int) (refused bool, err error) {
	err = proc.Poll(refuseBound, func() bool {
		if !r.c.Running(i) {
			refused = true
			return true
		}
		_, err := r.c.Status(context.Background(), i)
		return err == nil
	})
	if err != nil {
		return false, fmt.Errorf("neither refused nor served: %w", err)
	}
	return refused, nil
}

// flipByte XORs a random byte into dir's newest WAL segment, inside its records (two times in five), its
// raft.db (two in five) or its ack file, and returns the file, the offset and the byte that was there.
func flipByte(dir string, rng *rand.Rand) (path string, off int64, orig byte, err error) {
	path = filepath.Join(dir, raftlog.FileName)
	switch rng.IntN(5) {
	case 4:
		path = filepath.Join(dir, raftlog.AckFileName)
	case 0, 1:
		segs, err := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
		if err != nil || len(segs) == 0 {
			return "", 0, 0, fmt.Errorf("no WAL segment in %s (%v)", dir, err)
		}
		path = segs[len(segs)-1] // names sort by sequence number
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", 0, 0, err
	}
	used := len(b)
	if filepath.Ext(path) == ".wal" {
		used = len(bytes.TrimRight(b, "\x00")) // the records, not the preallocated zeros
	}
	if used == 0 {
		return "", 0, 0, fmt.Errorf("%s holds nothing", path)
	}
	off = int64(rng.IntN(used))
	orig = b[off]
	return path, off, orig, writeByte(path, off, orig^byte(1+rng.IntN(255)))
}

func writeByte(path string, off int64, v byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt([]byte{v}, off)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (r *run) diskFinding(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.diskFindings = append(r.diskFindings, fmt.Sprintf(format, args...))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
