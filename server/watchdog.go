package server

import "github.com/leased/leased/server/internal/raftnode"

// newWatchdog returns the disk watchdog of n's raft log writes (decision 13): snapshots go to logPath
// (raft.db), saves and compactions to the WAL segment walPath names (nil: logPath too).
func newWatchdog(n *node, logPath string, walPath func() string) *raftnode.Watchdog {
	return raftnode.NewWatchdog(raftnode.WatchdogConfig{
		Path: func(op string) string {
			if op == "snapshot" || walPath == nil {
				return logPath
			}
			return walPath()
		},
		BeforeWrite: n.faults.beforeWrite,
		Stop:        n.stopped,
		Fatal: func() error {
			if p := n.fatalErr.Load(); p != nil {
				return *p
			}
			return nil
		},
	})
}

// watchDisk runs n's disk watchdog until stop closes or n stops. On a stalled write it stops n serving
// with the watchdog's error, while n's Ready loop may still be blocked in that write.
func watchDisk(n *node, stop <-chan struct{}) {
	n.watchdog.Watch(stop, n.done, n.cfg.DiskStallTimeout, func(err error) {
		n.fail(err)
		n.halt()
	})
}
