package server

import (
	"sync/atomic"
	"time"
)

// diskStatsPeriod is how often diskStats.run measures the raft log and the data dir's free space. A scrape
// comes every 15 s or so; measuring after every raft log write would cost the Ready loop a bbolt read
// transaction and a stat of every WAL segment per save, and the free space falls with what other
// processes write to the volume too.
const diskStatsPeriod = time.Second

// diskStats are the raft log's size and the free space on the data dir's filesystem, as /metrics and
// Status report them. They are measured off the request path, every diskStatsPeriod by run, and read from
// memory. raftlog holds its lock across a write and its fsync, so a scrape or a Status call that asked it
// directly would hang for as long as a stalled disk does, and the stall metrics would never be seen; run
// waits instead, and the figures stay those from before the stall.
type diskStats struct {
	logBytes  atomic.Int64
	freeBytes atomic.Int64 // -1: unknown (no statfs on this platform, or it failed)
}

func newDiskStats(store logStore, dir string) *diskStats {
	d := &diskStats{}
	d.freeBytes.Store(-1)
	d.measure(store, dir)
	return d
}

// measure records the log's size and the filesystem's free space; it may block while a write holds the
// log, which is why only run (and newDiskStats, before the node starts) calls it.
func (d *diskStats) measure(store logStore, dir string) {
	d.logBytes.Store(store.Size())
	if free, ok := freeBytes(dir); ok {
		d.freeBytes.Store(free)
	}
}

// run measures every diskStatsPeriod until stop closes.
func (d *diskStats) run(stop <-chan struct{}, store logStore, dir string) {
	ticker := time.NewTicker(diskStatsPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
			d.measure(store, dir)
		}
	}
}
