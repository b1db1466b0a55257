//go:build !(linux || darwin || freebsd)

package server

// freeBytes is unknown on this platform.
func freeBytes(string) (int64, bool) { return 0, false }
