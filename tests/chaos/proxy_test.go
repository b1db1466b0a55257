package chaos

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// faultProxy sits on every peer link of a cluster. Each node i runs with HTTPS_PROXY pointing at its own
// listener, and every node's peer address in --initial-cluster is a hostname (n1.chaos.leased.test:port)
// rather than an IP, so the node's gRPC peer transport dials through the proxy with HTTP CONNECT (grpc-go
// bypasses proxies only for IPs on loopback and "localhost"). The proxy therefore knows the directed link
// i→j of every connection: the listener it arrived on names i, the CONNECT target names j. No
// privileges, no change to the server.
//
// Per directed link it can refuse and cut connections (a one-way partition: i's messages to j are lost;
// j's messages to i travel over j's own connections) and delay the bytes from i to j. A full partition cuts
// both directions.
type faultProxy struct {
	hosts map[string]int // CONNECT host -> node index
	peers []string       // real peer addresses (127.0.0.1:port)
	lis   []net.Listener

	mu     sync.Mutex
	links  map[link]linkState
	conns  map[link]map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

type link struct{ from, to int }

type linkState struct {
	cut   bool
	delay time.Duration
}

func peerHost(i int) string { return fmt.Sprintf("n%d.chaos.leased.test", i+1) }

func newFaultProxy(peers []string) (*faultProxy, error) {
	p := &faultProxy{
		hosts: map[string]int{}, peers: peers,
		links: map[link]linkState{}, conns: map[link]map[net.Conn]struct{}{},
	}
	for i := range peers {
		p.hosts[peerHost(i)] = i
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.close()
			return nil, err
		}
		p.lis = append(p.lis, l)
	}
	for i, l := range p.lis {
		p.wg.Add(1)
		go p.serve(i, l)
	}
	return p, nil
}

// url is the HTTPS_PROXY value for node i.
func (p *faultProxy) url(i int) string { return "http://" + p.lis[i].Addr().String() }

func (p *faultProxy) serve(from int, l net.Listener) {
	defer p.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.handle(from, c)
	}
}

func (p *faultProxy) handle(from int, c net.Conn) {
	defer p.wg.Done()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		_ = c.Close()
		return
	}
	host, port, _ := net.SplitHostPort(req.Host)
	to, ok := p.hosts[host]
	if !ok {
		_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\n\r\n")
		_ = c.Close()
		return
	}
	if _, realPort, _ := net.SplitHostPort(p.peers[to]); realPort != port {
		_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\n\r\n")
		_ = c.Close()
		return
	}
	lk := link{from, to}
	if p.state(lk).cut {
		_, _ = io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\n\r\n")
		_ = c.Close()
		return
	}
	d, err := net.DialTimeout("tcp", p.peers[to], 2*time.Second)
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		_ = c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		_ = c.Close()
		_ = d.Close()
		return
	}
	if !p.track(lk, c, d) { // cut (or closed) while we dialled
		_ = c.Close()
		_ = d.Close()
		return
	}
	defer p.untrack(lk, c, d)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // j -> i: plain copy
		defer wg.Done()
		_, _ = io.Copy(c, d)
		_ = c.Close()
		_ = d.Close()
	}()
	p.forward(lk, br, d) // i -> j: with the link's delay
	_ = c.Close()
	_ = d.Close()
	wg.Wait()
}

type chunk struct {
	b  []byte
	at time.Time
}

// forward copies src to dst, holding each chunk until its arrival time plus the link's current delay, so
// a delay adds latency without throttling throughput.
func (p *faultProxy) forward(lk link, src io.Reader, dst net.Conn) {
	ch := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range ch {
			if d := p.state(lk).delay; d > 0 {
				if wait := time.Until(c.at.Add(d)); wait > 0 {
					time.Sleep(wait) // the link's latency, not a wait for a condition
				}
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = dst.Close()
				for range ch { // drain so the reader never blocks
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}
		}
		if err != nil {
			break
		}
	}
	close(ch)
	<-done
}

func (p *faultProxy) state(lk link) linkState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.links[lk]
}

func (p *faultProxy) track(lk link, cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.links[lk].cut {
		return false
	}
	if p.conns[lk] == nil {
		p.conns[lk] = map[net.Conn]struct{}{}
	}
	for _, c := range cs {
		p.conns[lk][c] = struct{}{}
	}
	return true
}

func (p *faultProxy) untrack(lk link, cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns[lk], c)
	}
}

// set changes link from→to; cutting it closes its open connections at once.
func (p *faultProxy) set(from, to int, st linkState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lk := link{from, to}
	p.links[lk] = st
	if st.cut {
		for c := range p.conns[lk] {
			_ = c.Close()
		}
	}
}

// cut drops everything i sends to j (one way).
func (p *faultProxy) cut(i, j int) { p.set(i, j, linkState{cut: true}) }

// partition cuts every link between group a and the rest, both ways.
func (p *faultProxy) partition(a ...int) {
	in := map[int]bool{}
	for _, i := range a {
		in[i] = true
	}
	for i := range p.peers {
		for j := range p.peers {
			if i != j && in[i] != in[j] {
				p.cut(i, j)
			}
		}
	}
}

// delay adds d of latency to everything node i sends.
func (p *faultProxy) delay(i int, d time.Duration) {
	for j := range p.peers {
		if j != i {
			p.set(i, j, linkState{delay: d})
		}
	}
}

// heal restores every link.
func (p *faultProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.links = map[link]linkState{}
}

func (p *faultProxy) close() {
	p.mu.Lock()
	p.closed = true
	for _, m := range p.conns {
		for c := range m {
			_ = c.Close()
		}
	}
	p.mu.Unlock()
	for _, l := range p.lis {
		_ = l.Close()
	}
	p.wg.Wait()
}
