//go:build unix

package rpc

import "syscall"

// descriptorLimit is the process's soft RLIMIT_NOFILE; 1024 when it cannot be read.
func descriptorLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur == 0 {
		return 1024
	}
	return r.Cur
}
