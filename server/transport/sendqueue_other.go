//go:build !linux

package transport

import "syscall"

// sendRoom cannot tell without Linux's SO_MEMINFO, so it never allows a write from Send: every message
// goes through the peer's goroutine.
func sendRoom(syscall.RawConn, int) bool { return false }
