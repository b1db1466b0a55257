//go:build linux || darwin || freebsd

package server

import "golang.org/x/sys/unix"

// freeBytes is the space on dir's filesystem that an unprivileged process may still use. (The
// conversions are needed where Statfs_t's fields are not int64.)
func freeBytes(dir string) (int64, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
