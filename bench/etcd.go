package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/leased/leased/client/loadgen"
)

// etcdSystem runs three etcd nodes with etcd's defaults (100 ms heartbeat, 1 s election), the backend
// quota raised so that the held-leases row fits. Load comes from clientv3 and its concurrency package,
// one client per loadgen.WorkersPerClient workers, as the leased side groups its workers.
type etcdSystem struct {
	bin       string
	procs     []*proc
	clientEps []string
	clients   []*clientv3.Client
	sessions  []*concurrency.Session
	probe     *clientv3.Client
	runs      int // workloads started on this cluster: each gets its own key prefix
}

// errEtcdHeld is an etcd acquire whose key someone else created first (never, with fresh keys).
var errEtcdHeld = errors.New("etcd: key already held")

func (s *etcdSystem) name() string          { return "etcd" }
func (s *etcdSystem) nodes() []*proc        { return s.procs }
func (s *etcdSystem) readyURL(i int) string { return "http://" + s.clientEps[i] + "/readyz" }

func (s *etcdSystem) start(ctx context.Context, dir string) error {
	ports, err := freePorts(6)
	if err != nil {
		return err
	}
	s.procs, s.clientEps, s.runs = nil, nil, 0
	var initial []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("e%d=http://127.0.0.1:%d", i+1, ports[2*i+1]))
	}
	for i := range 3 {
		name := fmt.Sprintf("e%d", i+1)
		cl, peer := "http://"+addr(ports[2*i]), "http://"+addr(ports[2*i+1])
		s.clientEps = append(s.clientEps, addr(ports[2*i]))
		p := &proc{name: "etcd-" + name, logPath: filepath.Join(dir, name+".log"), argv: []string{
			s.bin, "--name=" + name, "--data-dir=" + filepath.Join(dir, name),
			"--listen-client-urls=" + cl, "--advertise-client-urls=" + cl,
			"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=" + strings.Join(initial, ","), "--initial-cluster-state=new",
			"--initial-cluster-token=bench", "--log-level=warn", "--quota-backend-bytes=8589934592",
		}}
		s.procs = append(s.procs, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	if s.probe, err = s.newClient(s.clientEps); err != nil {
		return err
	}
	op, err := s.acquire(ctx, 1, 10*time.Second)
	if err != nil {
		return err
	}
	return waitWritable(ctx, op, 30*time.Second)
}

func (s *etcdSystem) newClient(endpoints []string) (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	s.clients = append(s.clients, c)
	return c, nil
}

// connect returns the clients of a workload's workers: worker w uses the result's [w % len].
func (s *etcdSystem) connect(workers int) ([]*clientv3.Client, error) {
	return s.connectTo(workers, s.clientEps)
}

// connectTo is connect with clients of endpoints only.
func (s *etcdSystem) connectTo(workers int, endpoints []string) ([]*clientv3.Client, error) {
	var cs []*clientv3.Client
	for range max((workers+loadgen.WorkersPerClient-1)/loadgen.WorkersPerClient, 1) {
		c, err := s.newClient(endpoints)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func (s *etcdSystem) stop() {
	for _, se := range s.sessions {
		_ = se.Close()
	}
	for _, c := range s.clients {
		_ = c.Close()
	}
	s.sessions, s.clients, s.probe = nil, nil, nil
	for _, p := range s.procs {
		p.kill()
	}
}

// acquire is how etcd's users take a named lease: Grant a lease, then a Txn that creates the key, bound
// to it, if it does not exist.
func (s *etcdSystem) acquire(_ context.Context, clients int, ttl time.Duration) (loadgen.Op, error) {
	cs, err := s.connect(clients)
	if err != nil {
		return nil, err
	}
	s.runs++
	prefix := fmt.Sprintf("bench/acquire-%d", s.runs)
	secs := int64(max(ttl/time.Second, 1))
	return func(ctx context.Context, worker, seq int) error {
		_, err := take(ctx, cs[worker%len(cs)], fmt.Sprintf("%s/%d/%d", prefix, worker, seq), secs)
		return err
	}, nil
}

// take grants a lease of secs seconds and creates key bound to it, if key does not exist.
func take(ctx context.Context, c *clientv3.Client, key string, secs int64) (clientv3.LeaseID, error) {
	g, err := c.Grant(ctx, secs)
	if err != nil {
		return 0, err
	}
	resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, "bench", clientv3.WithLease(g.ID))).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, errEtcdHeld
	}
	return g.ID, nil
}

// churn is acquire followed by a Revoke of the lease, which deletes the key bound to it: the held
// state stays small however long it runs.
func (s *etcdSystem) churn(ctx context.Context, clients int) (loadgen.Op, error) {
	cs, err := s.connect(clients)
	if err != nil {
		return nil, err
	}
	s.runs++
	prefix := fmt.Sprintf("bench/churn-%d", s.runs)
	return func(ctx context.Context, worker, seq int) error {
		c := cs[worker%len(cs)]
		id, err := take(ctx, c, fmt.Sprintf("%s/%d/%d", prefix, worker, seq), 10)
		if err != nil {
			return err
		}
		_, err = c.Revoke(ctx, id)
		return err
	}, nil
}

// term is the highest raft term the running members report.
func (s *etcdSystem) term(ctx context.Context) (uint64, error) {
	return highestTerm(ctx, s.procs, s.clientEps, func(ctx context.Context, ep string) (uint64, error) {
		st, err := s.probe.Status(ctx, ep)
		if err != nil {
			return 0, err
		}
		return st.RaftTerm, nil
	})
}

// contended gives each worker its own session and concurrency.Mutex on one prefix: Lock waits its turn
// (etcd's mutex is FIFO by creation revision), Unlock hands over.
func (s *etcdSystem) contended(ctx context.Context, clients int) (loadgen.Op, error) {
	cs, err := s.connect(clients)
	if err != nil {
		return nil, err
	}
	mus := make([]*concurrency.Mutex, clients)
	for w := range clients {
		se, err := concurrency.NewSession(cs[w%len(cs)], concurrency.WithTTL(10), concurrency.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		s.sessions = append(s.sessions, se)
		mus[w] = concurrency.NewMutex(se, "bench/contended")
	}
	return func(ctx context.Context, worker, _ int) error {
		if err := mus[worker].Lock(ctx); err != nil {
			return err
		}
		return mus[worker].Unlock(ctx)
	}, nil
}

// renew grants one lease per worker and renews it with KeepAliveOnce, etcd's unary renewal.
func (s *etcdSystem) renew(ctx context.Context, clients int) (loadgen.Op, error) {
	cs, err := s.connect(clients)
	if err != nil {
		return nil, err
	}
	ids := make([]clientv3.LeaseID, clients)
	for w := range clients {
		gctx, cancel := context.WithTimeout(ctx, opTimeout)
		g, err := cs[w%len(cs)].Grant(gctx, 30)
		cancel()
		if err != nil {
			return nil, err
		}
		ids[w] = g.ID
	}
	return func(ctx context.Context, worker, _ int) error {
		_, err := cs[worker%len(cs)].KeepAliveOnce(ctx, ids[worker])
		return err
	}, nil
}

// read puts bench/read and reads it with Get from a client of the leader alone (etcd's client would
// otherwise spread the reads over the nodes, and a follower's linearizable read asks the leader).
func (s *etcdSystem) read(ctx context.Context, clients int, serializable bool) (loadgen.Op, error) {
	leader := s.leader(ctx)
	if leader < 0 {
		return nil, errors.New("no leader")
	}
	cs, err := s.connectTo(clients, s.clientEps[leader:leader+1])
	if err != nil {
		return nil, err
	}
	const key = "bench/read"
	pctx, cancel := context.WithTimeout(ctx, opTimeout)
	_, err = cs[0].Put(pctx, key, "v")
	cancel()
	if err != nil {
		return nil, err
	}
	var opts []clientv3.OpOption
	if serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	return func(ctx context.Context, worker, _ int) error {
		r, err := cs[worker%len(cs)].Get(ctx, key, opts...)
		if err == nil && len(r.Kvs) != 1 {
			err = fmt.Errorf("get %s: %d keys", key, len(r.Kvs))
		}
		return err
	}, nil
}

func (s *etcdSystem) leader(ctx context.Context) int {
	for i, ep := range s.clientEps {
		if !s.procs[i].running() {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		st, err := s.probe.Status(ctx, ep)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.GetMemberId() {
			return i
		}
	}
	return -1
}

// keepAlive grants leases leases (TTL 60 s) and opens one LeaseKeepAlive stream per worker; an operation
// renews batch of them by pipelining batch requests on the worker's stream, then reading the batch
// answers: etcd renews one lease per request, so this is the closest to a batch it has.
func (s *etcdSystem) keepAlive(ctx context.Context, workers, leases, batch int) (loadgen.Op, error) {
	ids := make([]int64, leases)
	err := loadgen.Fill(ctx, fillOptions(leases), func(ctx context.Context, i int) error {
		g, err := s.probe.Grant(ctx, 60)
		if err == nil {
			ids[i] = int64(g.ID)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("grant the leases to renew: %w", err)
	}
	streams := make([]pb.Lease_LeaseKeepAliveClient, workers)
	for w := range streams {
		if streams[w], err = pb.NewLeaseClient(s.probe.ActiveConnection()).LeaseKeepAlive(ctx); err != nil {
			return nil, err
		}
	}
	return func(_ context.Context, worker, seq int) error {
		st := streams[worker]
		first := loadgen.BatchStart(worker, seq, workers, leases, batch)
		for i := range batch {
			if err := st.Send(&pb.LeaseKeepAliveRequest{ID: ids[(first+i)%leases]}); err != nil {
				return err
			}
		}
		for range batch {
			resp, err := st.Recv()
			if err != nil {
				return err
			}
			if resp.TTL <= 0 {
				return fmt.Errorf("etcd: lease %x not renewed", resp.ID)
			}
		}
		return nil
	}, nil
}
