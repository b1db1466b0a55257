package servertest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"
)

// FreeAddrs returns n distinct loopback addresses that were free a moment ago. The ports are drawn
// below the kernel's ephemeral range (which starts at 32768 by default), not from it as :0 would: the
// processes restart on these ports for the whole run, and a port from the ephemeral range can be taken
// meanwhile as the local end of any outgoing connection on the machine (another test run's clients), so
// a restarted node found its port in use. Each is checked by listening on it, then closed.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	const lo, hi = 20000, 32768 // below the ephemeral range
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	seen := map[int]bool{}
	var addrs []string
	for tries := 0; len(addrs) < n; tries++ {
		if tries == 1000 {
			t.Fatalf("no %d free loopback ports in %d..%d", n, lo, hi-1)
		}
		port := lo + rng.IntN(hi-lo)
		if seen[port] {
			continue
		}
		seen[port] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken: draw another
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}
