//go:build !unix

package rpc

// descriptorLimit is a conservative guess where the process has no RLIMIT_NOFILE to read.
func descriptorLimit() uint64 { return 8192 }
