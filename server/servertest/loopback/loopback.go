// Package loopback gives tests a loopback port that refuses connections and stays theirs: a "dead" peer
// or endpoint that can later come to life on the same address.
//
// The usual way, listening on 127.0.0.1:0 and closing at once, frees the port for the next socket to ask
// for one, which may be the test's own server; a client meant to find nothing there then reaches that
// server instead. A socket bound but not listening refuses connections just the same, and holds the port.
package loopback

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
)

// Port is a loopback port reserved for one test.
type Port struct {
	Addr string // host:port
	fd   int    // the bound socket; -1 once Listen has taken it
}

// ReservePort binds a loopback port without listening on it, until the test ends or Listen is called.
func ReservePort(t testing.TB) *Port {
	t.Helper()
	// No SO_REUSEADDR (net.Listen would set it): a port is shared only between sockets that both set it.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	syscall.CloseOnExec(fd)
	p := &Port{fd: fd}
	t.Cleanup(func() {
		if p.fd >= 0 {
			_ = syscall.Close(p.fd)
		}
	})
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	p.Addr = fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	return p
}

// Listen brings the port to life on the socket that held it, so nothing else can take it in between.
// The caller closes the listener.
func (p *Port) Listen(t testing.TB) net.Listener {
	t.Helper()
	if p.fd < 0 {
		t.Fatalf("%s: Listen called twice", p.Addr)
	}
	if err := syscall.Listen(p.fd, syscall.SOMAXCONN); err != nil {
		t.Fatalf("listen on %s: %v", p.Addr, err)
	}
	f := os.NewFile(uintptr(p.fd), p.Addr)
	p.fd = -1
	defer f.Close()
	lis, err := net.FileListener(f) // a duplicate of the socket; f's own descriptor is closed above
	if err != nil {
		t.Fatalf("listener on %s: %v", p.Addr, err)
	}
	return lis
}
