package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/client/loadgen"
)

// leasedSystem runs three leased nodes with the production defaults (100 ms ticks, 10-tick election
// timeout, like etcd's 100 ms heartbeat and 1 s election), with the cluster-wide lease limits raised so
// that the held-leases row fits. Load comes from the SDK, through client/loadgen's Pool.
type leasedSystem struct {
	bin        string
	maxLeases  int // --max-leases
	procs      []*proc
	clientEps  []string
	adminEps   []string
	pools      []*loadgen.Pool
	conns      []*grpc.ClientConn // raw API connections (keepAlive)
	keepAlives []*loadgen.KeepAlive
	probe      *client.Client
}

func (s *leasedSystem) name() string          { return "leased" }
func (s *leasedSystem) nodes() []*proc        { return s.procs }
func (s *leasedSystem) readyURL(i int) string { return "http://" + s.adminEps[i] + "/readyz" }

func (s *leasedSystem) start(ctx context.Context, dir string) error {
	ports, err := freePorts(9)
	if err != nil {
		return err
	}
	s.procs, s.clientEps, s.adminEps = nil, nil, nil
	var initial []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("n%d=127.0.0.1:%d", i+1, ports[3*i+1]))
	}
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		client, peer, admin := addr(ports[3*i]), addr(ports[3*i+1]), addr(ports[3*i+2])
		s.clientEps, s.adminEps = append(s.clientEps, client), append(s.adminEps, admin)
		p := &proc{name: "leased-" + name, logPath: filepath.Join(dir, name+".log"), argv: []string{
			s.bin, "--name=" + name, "--data-dir=" + filepath.Join(dir, name),
			"--client-addr=" + client, "--peer-addr=" + peer, "--admin-addr=" + admin,
			"--initial-cluster=" + strings.Join(initial, ","), "--log-level=warn",
			"--max-leases=" + strconv.Itoa(s.maxLeases), "--quota-bytes=" + strconv.Itoa(max(s.maxLeases*1024, 512<<20)),
		}}
		s.procs = append(s.procs, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	if s.probe, err = client.New(client.Config{Endpoints: s.clientEps, Holder: "bench-probe"}); err != nil {
		return err
	}
	op, err := s.acquire(ctx, 1, 10*time.Second)
	if err != nil {
		return err
	}
	return waitWritable(ctx, op, 30*time.Second)
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

func (s *leasedSystem) stop() {
	for _, ka := range s.keepAlives {
		ka.Close()
	}
	s.keepAlives = nil
	for _, p := range s.pools {
		_ = p.Close()
	}
	s.pools = nil
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
	if s.probe != nil {
		_ = s.probe.Close()
		s.probe = nil
	}
	for _, p := range s.procs {
		p.kill()
	}
}

// pool connects the SDK clients of a workload; stop closes them.
func (s *leasedSystem) pool(clients int) (*loadgen.Pool, error) {
	p, err := loadgen.NewPool(client.Config{Endpoints: s.clientEps, Holder: "bench"}, clients)
	if err != nil {
		return nil, err
	}
	s.pools = append(s.pools, p)
	return p, nil
}

func (s *leasedSystem) acquire(_ context.Context, clients int, ttl time.Duration) (loadgen.Op, error) {
	p, err := s.pool(clients)
	if err != nil {
		return nil, err
	}
	return p.Acquire(fmt.Sprintf("bench/acquire-%d", len(s.pools)), ttl), nil
}

func (s *leasedSystem) churn(_ context.Context, clients int) (loadgen.Op, error) {
	p, err := s.pool(clients)
	if err != nil {
		return nil, err
	}
	return p.Churn(fmt.Sprintf("bench/churn-%d", len(s.pools)), 10*time.Second), nil
}

// term is the highest raft term the running nodes report.
func (s *leasedSystem) term(ctx context.Context) (uint64, error) {
	return highestTerm(ctx, s.procs, s.clientEps, func(ctx context.Context, ep string) (uint64, error) {
		st, err := s.probe.Status(ctx, ep)
		return st.GetTerm(), err
	})
}

func (s *leasedSystem) contended(_ context.Context, clients int) (loadgen.Op, error) {
	p, err := s.pool(clients)
	if err != nil {
		return nil, err
	}
	return p.Contended("bench/contended", 10*time.Second), nil
}

func (s *leasedSystem) renew(ctx context.Context, clients int) (loadgen.Op, error) {
	p, err := s.pool(clients)
	if err != nil {
		return nil, err
	}
	return p.Renew(ctx, "bench/renew", clients, 30*time.Second)
}

// read holds bench/read and reads it with the SDK's Get, which asks the leader.
func (s *leasedSystem) read(ctx context.Context, clients int, serializable bool) (loadgen.Op, error) {
	p, err := s.pool(clients)
	if err != nil {
		return nil, err
	}
	return p.Read(ctx, "bench/read", 30*time.Second, serializable)
}

func (s *leasedSystem) leader(ctx context.Context) int {
	for i, ep := range s.clientEps {
		if !s.procs[i].running() {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		st, err := s.probe.Status(ctx, ep)
		cancel()
		if err == nil && st.GetRole() == leasepb.Role_ROLE_LEADER {
			return i
		}
	}
	return -1
}

// keepAlive takes leases leases (TTL 60 s) through the raw API on the leader and opens one KeepAlive
// stream per worker there (client/loadgen, the load `leasectl bench keepalive` runs); an operation
// renews batch of them in one request.
func (s *leasedSystem) keepAlive(ctx context.Context, workers, leases, batch int) (loadgen.Op, error) {
	leader := s.leader(ctx)
	if leader < 0 {
		return nil, errors.New("no leader to renew on")
	}
	conn, err := loadgen.Dial(s.clientEps[leader], nil)
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, conn)
	api := leasepb.NewLeasesClient(conn)
	refs, err := loadgen.TakeLeases(ctx, api, fillOptions(leases), "bench/batched", 60*time.Second)
	if err != nil {
		return nil, fmt.Errorf("acquire the leases to renew: %w", err)
	}
	ka, err := loadgen.OpenKeepAlive(ctx, api, refs, workers, batch)
	if err != nil {
		return nil, err
	}
	s.keepAlives = append(s.keepAlives, ka)
	return ka.Op(), nil
}
