package transport

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sendRoom reports whether a write of n bytes to the socket will not wait for its peer: Linux's TCP
// blocks a write only when the bytes it holds, sent or not, acknowledged or not (sk_wmem_queued, with
// their buffers' overhead), reach the send buffer's size. SO_MEMINFO reads both. The margin covers one
// more buffer of the largest size TCP allocates.
func sendRoom(rc syscall.RawConn, n int) bool {
	var info [unix.SK_MEMINFO_VARS]uint32
	var errno syscall.Errno
	err := rc.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(info))
		// x/sys/unix has no getsockopt for a uint32 array; this is its own call, spelled out.
		_, _, errno = syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&size)), 0)
	})
	if err != nil || errno != 0 {
		return false
	}
	const margin = 64 << 10
	return uint64(info[unix.SK_MEMINFO_WMEM_QUEUED])+uint64(n)+margin < uint64(info[unix.SK_MEMINFO_SNDBUF])
}
