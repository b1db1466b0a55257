package loopback

import (
	"net"
	"testing"
)

// A reserved port refuses connections, is given to no other socket, and accepts once Listen is called.
func TestReservedPortRefusesAndIsNotShared(t *testing.T) {
	p := ReservePort(t)
	if c, err := net.Dial("tcp", p.Addr); err == nil {
		_ = c.Close()
		t.Fatalf("dial %s: connected, want refused", p.Addr)
	}
	if l, err := net.Listen("tcp", p.Addr); err == nil {
		_ = l.Close()
		t.Fatalf("listen %s: another socket was given the reserved port", p.Addr)
	}
	lis := p.Listen(t)
	defer lis.Close()
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatalf("dial %s after Listen: %v", p.Addr, err)
	}
	_ = c.Close()
}
