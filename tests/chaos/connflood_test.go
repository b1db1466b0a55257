package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// The connection flood, part of the flood nemesis (flood_test.go): a client opens idle TCP connections to
// the leader's client port, more than --max-connections allows, and holds them. Its promises, checked under
// "limits" like the other floods:
//   - no more than the limit is kept, and every connection past it is closed promptly (within
//     connFloodPrompt: a fast error for the client, not a wait in the accept queue);
//   - while the flood holds every slot, the leader's admin port answers /healthz and /readyz with 200, and
//     a client connected before the flood still gets answers (the harness's own connection);
//   - through the term check of floodNemesis, the flood costs no election.
//
// The limit reaches the nodes as LEASED_MAX_CONNECTIONS (connFloodEnv), the flag's environment form.

const (
	connFloodLimit  = 256
	connFloodExcess = 64
	connFloodPrompt = 2 * time.Second
)

// connFloodEnv is the nodes' environment for the connection flood's limit.
var connFloodEnv = []string{fmt.Sprintf("LEASED_MAX_CONNECTIONS=%d", connFloodLimit)}

// connFloodOutcome is what a connection flood saw.
type connFloodOutcome struct {
	dialed, kept, refused int
	findings              []string
}

func (o connFloodOutcome) String() string {
	return fmt.Sprintf("%d dialed, %d kept, %d closed on accept", o.dialed, o.kept, o.refused)
}

// floodConnections floods node ld's client port (floodConns) while checking its admin port and the
// harness's own connection to it.
func (r *run) floodConnections(ctx context.Context, ld int) connFloodOutcome {
	n := r.c.Nodes[ld]
	served := func(ctx context.Context) error {
		_, err := r.c.Status(ctx, ld)
		return err
	}
	return floodConns(ctx, fmt.Sprintf("n%d", ld+1), n.ClientAddr, n.AdminAddr, served)
}

// floodConns dials connFloodLimit+connFloodExcess idle connections to addr, classifies each (kept, or
// closed within connFloodPrompt), checks that the admin address (if any) answers /healthz and /readyz and
// that served (a call on a connection made before) succeeds while they are held, then closes them all.
func floodConns(ctx context.Context, node, addr, admin string, served func(context.Context) error) connFloodOutcome {
	var o connFloodOutcome
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	d := net.Dialer{Timeout: connFloodPrompt}
	for range connFloodLimit + connFloodExcess {
		c, err := d.DialContext(ctx, "tcp", addr)
		if errors.Is(err, syscall.ECONNRESET) {
			o.dialed, o.refused = o.dialed+1, o.refused+1 // closed on accept before the dial returned
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return o
			}
			o.findings = append(o.findings, fmt.Sprintf("connection flood on %s: dial %d: %v", node, o.dialed+1, err))
			break
		}
		conns = append(conns, c)
		o.dialed++
	}
	for _, gone := range closedOnAccept(conns) {
		if gone {
			o.refused++
		} else {
			o.kept++
		}
	}
	if o.kept > connFloodLimit || o.refused < o.dialed-connFloodLimit {
		o.findings = append(o.findings, fmt.Sprintf("connection flood on %s: %v; want at most %d kept and the rest closed within %v (--max-connections)",
			node, o, connFloodLimit, connFloodPrompt))
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, path := range []string{"/healthz", "/readyz"} {
		if admin == "" {
			break
		}
		resp, err := hc.Get("http://" + admin + path)
		if err != nil {
			o.findings = append(o.findings, fmt.Sprintf("connection flood on %s: admin %s: %v", node, path, err))
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			o.findings = append(o.findings, fmt.Sprintf("connection flood on %s: admin %s answered %s", node, path, resp.Status))
		}
	}
	if err := served(ctx); err != nil && ctx.Err() == nil {
		o.findings = append(o.findings, fmt.Sprintf("connection flood on %s: a client connected before it got %v", node, err))
	}
	return o
}

// closedOnAccept reads from every connection for up to connFloodPrompt, in parallel, and reports which the
// server closed; one it sent data on (a gRPC port's HTTP/2 SETTINGS) or left silent was kept.
func closedOnAccept(conns []net.Conn) []bool {
	closed := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(connFloodPrompt))
			n, err := c.Read(make([]byte, 64))
			var ne net.Error
			closed[i] = n == 0 && err != nil && !(errors.As(err, &ne) && ne.Timeout())
		})
	}
	wg.Wait()
	return closed
}
