package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leased/leased/client/loadgen"
)

// Debian's zookeeper package (bench/zookeeper.sh installs it): the server's jar, whose manifest names
// its dependencies, and the class its zkServer.sh starts.
const (
	zkJar       = "/usr/share/java/zookeeper.jar"
	zkClasspath = "/etc/zookeeper/conf:" + zkJar
	zkMain      = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
)

// zkAvailable says why ZooKeeper cannot run here ("" when it can): its jar and a java on PATH.
func zkAvailable() string {
	if _, err := os.Stat(zkJar); err != nil {
		return zkJar + " missing (bench/zookeeper.sh installs Debian's zookeeper as root)"
	}
	if _, err := exec.LookPath("java"); err != nil {
		return "no java on PATH (bench/zookeeper.sh installs Debian's default-jre as root)"
	}
	return ""
}

// zkSystem runs a three-server ZooKeeper ensemble as zkServer.sh does (QuorumPeerMain with the JVM's
// defaults, no heap limit), with the sample zoo.cfg's timing (2 s ticks, initLimit 10, syncLimit 5) and
// every other setting at its default (forceSync on), the admin server off (its fixed port would clash)
// and the srvr four-letter word allowed (it names the leader). Load comes from go-zookeeper's client with
// the standard recipes, one session per loadgen.WorkersPerClient workers, as the others group theirs.
type zkSystem struct {
	procs     []*proc
	clientEps []string
	conns     []*zk.Conn
	runs      int    // workloads started on this cluster: each gets its own parent znode
	version   string // the srvr word's "Zookeeper version", once a server answered
}

// errZKHeld is a create on a name that exists (never, with fresh names).
var errZKHeld = errors.New("zookeeper: node already exists")

func (s *zkSystem) name() string        { return "zookeeper" }
func (s *zkSystem) nodes() []*proc      { return s.procs }
func (s *zkSystem) readyURL(int) string { return "" } // unused: ready answers instead

// ready is the readiness check of a server (see readier): it serves clients as leader or follower.
func (s *zkSystem) ready(_ context.Context, i int) bool {
	mode, _, err := s.srvr(i)
	return err == nil && (mode == "leader" || mode == "follower")
}

func (s *zkSystem) start(ctx context.Context, dir string) error {
	ports, err := freePorts(9)
	if err != nil {
		return err
	}
	s.procs, s.clientEps, s.runs = nil, nil, 0
	var servers []string
	for i := range 3 {
		servers = append(servers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, ports[3*i+1], ports[3*i+2]))
		s.clientEps = append(s.clientEps, addr(ports[3*i]))
	}
	for i := range 3 {
		name := fmt.Sprintf("z%d", i+1)
		data := filepath.Join(dir, name)
		if err := writeZKConfig(data, i+1, ports[3*i], servers); err != nil {
			return err
		}
		p := &proc{name: "zookeeper-" + name, logPath: filepath.Join(dir, name+".log"), argv: []string{
			"java", "-Dzookeeper.log.dir=" + data, "-XX:OnOutOfMemoryError=kill -9 %p",
			"-cp", zkClasspath, zkMain, filepath.Join(data, "zoo.cfg"),
		}}
		s.procs = append(s.procs, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	// A JVM's start and the first election take seconds: wait until every server serves, then for a write.
	err = poll(ctx, time.Minute, func() bool { return s.ready(ctx, 0) && s.ready(ctx, 1) && s.ready(ctx, 2) })
	if err != nil {
		return fmt.Errorf("ensemble not serving: %w", err)
	}
	op, err := s.acquire(ctx, 1, 10*time.Second)
	if err != nil {
		return err
	}
	if err := waitWritable(ctx, op, 30*time.Second); err != nil {
		return err
	}
	return s.warmUp(ctx)
}

// zkWarmUp is how long a fresh ensemble takes and releases locks before a cell measures it.
const zkWarmUp = 2 * time.Second

// warmUp runs zkWarmUp of lock churn: a JVM interprets, then compiles, its hot code in its first seconds,
// which a production ensemble has long done; leased and etcd are compiled ahead of time. A memory cell's
// RSS baseline is read after it, so the compiled code is not counted as the leases'.
func (s *zkSystem) warmUp(ctx context.Context) error {
	op, err := s.churn(ctx, loadgen.WorkersPerClient)
	if err != nil {
		return err
	}
	_, err = loadgen.Run(ctx, loadgen.Options{Clients: loadgen.WorkersPerClient, Duration: zkWarmUp, MaxOps: loadgen.DefaultMaxOps, OpTimeout: opTimeout}, op)
	return err
}

// writeZKConfig writes server id's zoo.cfg and myid into data.
func writeZKConfig(data string, id, clientPort int, servers []string) error {
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	cfg := strings.Join(append([]string{
		"tickTime=2000", "initLimit=10", "syncLimit=5",
		"dataDir=" + data, "clientPort=" + strconv.Itoa(clientPort), "clientPortAddress=127.0.0.1",
		"admin.enableServer=false", "4lw.commands.whitelist=srvr",
	}, servers...), "\n") + "\n"
	if err := os.WriteFile(filepath.Join(data, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(id)+"\n"), 0o644)
}

// srvr asks server i for the srvr four-letter word and returns its mode (leader, follower, or "" when
// it does not serve) and the epoch of its last zxid (it grows with every election).
func (s *zkSystem) srvr(i int) (mode string, epoch uint64, err error) {
	c, err := net.DialTimeout("tcp", s.clientEps[i], 300*time.Millisecond)
	if err != nil {
		return "", 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return "", 0, err
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		switch k {
		case "Zookeeper version":
			v, _, _ = strings.Cut(v, ",")
			s.version, _, _ = strings.Cut(v, "-$") // Debian's build leaves "-${mvngit.commit.id}"
		case "Mode":
			mode = v
		case "Zxid":
			zxid, perr := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 64)
			if perr != nil {
				return "", 0, fmt.Errorf("srvr: bad zxid %q", v)
			}
			epoch = zxid >> 32
		}
	}
	return mode, epoch, sc.Err()
}

func (s *zkSystem) leader(context.Context) int {
	for i, p := range s.procs {
		if !p.running() {
			continue
		}
		if mode, _, err := s.srvr(i); err == nil && mode == "leader" {
			return i
		}
	}
	return -1
}

// term is the highest zxid epoch the running servers report: a new leader starts a new epoch.
func (s *zkSystem) term(ctx context.Context) (uint64, error) {
	var hi uint64
	for i, p := range s.procs {
		if !p.running() {
			continue
		}
		_, epoch, err := s.srvr(i)
		if err != nil {
			return 0, err
		}
		hi = max(hi, epoch)
	}
	return hi, nil
}

func (s *zkSystem) stop() {
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
	for _, p := range s.procs {
		p.kill()
	}
}

// quietLogger drops go-zookeeper's connection chatter.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// connect opens the sessions of a workload's workers (timeout ttl, which ZooKeeper clamps to 4–40 s with
// 2 s ticks): worker w uses the result's [w % len]. Each waits until its session is established.
func (s *zkSystem) connect(ctx context.Context, workers int, ttl time.Duration) ([]*zk.Conn, error) {
	return s.sessions(ctx, max((workers+loadgen.WorkersPerClient-1)/loadgen.WorkersPerClient, 1), ttl, s.clientEps)
}

// sessions opens n sessions on servers.
func (s *zkSystem) sessions(ctx context.Context, n int, ttl time.Duration, servers []string) ([]*zk.Conn, error) {
	var cs []*zk.Conn
	for range n {
		c, events, err := zk.Connect(servers, ttl, zk.WithLogger(quietLogger{}))
		if err != nil {
			return nil, err
		}
		s.conns = append(s.conns, c)
		if err := waitSession(ctx, events); err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// waitSession waits for a new connection's session, at most opTimeout. The events channel needs no
// draining afterwards: the client drops events when nobody reads them.
func waitSession(ctx context.Context, events <-chan zk.Event) error {
	timeout := time.After(opTimeout)
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				return nil
			}
		case <-timeout:
			return errors.New("zookeeper: no session within " + opTimeout.String())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// zkCall runs one blocking client call, returning early with ctx's error when ctx ends first. The
// client's calls take no context; the call's goroutine ends when the server answers, the connection
// drops (the client bounds a read by two thirds of the session timeout) or stop closes the connection.
func zkCall(ctx context.Context, call func() error) error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// parent creates a fresh persistent znode for a workload's children and returns its path.
func (s *zkSystem) parent(ctx context.Context, c *zk.Conn, what string) (string, error) {
	s.runs++
	path := fmt.Sprintf("/bench-%s-%d", what, s.runs)
	err := zkCall(ctx, func() error {
		_, err := c.Create(path, nil, 0, zk.WorldACL(zk.PermAll))
		return err
	})
	return path, err
}

// create makes an ephemeral znode at path: a lock on a fresh name, held as long as the session lives.
func create(ctx context.Context, c *zk.Conn, path string) error {
	return zkCall(ctx, func() error {
		_, err := c.Create(path, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		if errors.Is(err, zk.ErrNodeExists) {
			return errZKHeld
		}
		return err
	})
}

// acquire is how ZooKeeper's users take a lock on a name nobody holds: one ephemeral znode create in the
// worker's session (whose timeout, ttl, is the lease's).
func (s *zkSystem) acquire(ctx context.Context, clients int, ttl time.Duration) (loadgen.Op, error) {
	cs, err := s.connect(ctx, clients, ttl)
	if err != nil {
		return nil, err
	}
	dir, err := s.parent(ctx, cs[0], "acquire")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, worker, seq int) error {
		return create(ctx, cs[worker%len(cs)], fmt.Sprintf("%s/%d-%d", dir, worker, seq))
	}, nil
}

// churn is acquire followed by the delete that releases the lock.
func (s *zkSystem) churn(ctx context.Context, clients int) (loadgen.Op, error) {
	cs, err := s.connect(ctx, clients, 10*time.Second)
	if err != nil {
		return nil, err
	}
	dir, err := s.parent(ctx, cs[0], "churn")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, worker, seq int) error {
		c, path := cs[worker%len(cs)], fmt.Sprintf("%s/%d-%d", dir, worker, seq)
		if err := create(ctx, c, path); err != nil {
			return err
		}
		return zkCall(ctx, func() error { return c.Delete(path, -1) })
	}, nil
}

// contended is Curator's InterProcessMutex on one lock path: each worker's lock and unlock is one
// handoff (zkMutex). Each worker has a session of its own, as contending processes do: ZooKeeper answers
// a session's requests in order, so workers sharing one would queue a waiter's read behind the others'
// writes.
func (s *zkSystem) contended(ctx context.Context, clients int) (loadgen.Op, error) {
	cs, err := s.sessions(ctx, clients, 10*time.Second, s.clientEps)
	if err != nil {
		return nil, err
	}
	dir, err := s.parent(ctx, cs[0], "mutex")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, worker, _ int) error {
		m := zkMutex{c: cs[worker%len(cs)], dir: dir}
		if err := m.lock(ctx); err != nil {
			return err
		}
		return m.unlock(ctx)
	}, nil
}

// zkMutex is Curator's InterProcessMutex recipe (LockInternals): an ephemeral sequential child of dir,
// held once it is the lowest; until then a watch on the next lower child, the one to go before it.
type zkMutex struct {
	c    *zk.Conn
	dir  string
	node string // the child this lock attempt created
}

const zkLockPrefix = "lock-"

func (m *zkMutex) lock(ctx context.Context) error {
	err := zkCall(ctx, func() error {
		var err error
		m.node, err = m.c.Create(m.dir+"/"+zkLockPrefix, nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
		return err
	})
	if err != nil {
		return err
	}
	for {
		held, err := m.waitTurn(ctx)
		if held {
			return nil
		}
		if err == nil {
			continue
		}
		// Given up (the deadline, a lost connection): withdraw, as Curator does, lest the lock wedge.
		wctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		_ = m.unlock(wctx)
		cancel()
		return err
	}
}

// waitTurn reads the children once: held when m's node is the lowest; otherwise it waits until the
// node before it is gone (nil error: look again) or ctx ends.
func (m *zkMutex) waitTurn(ctx context.Context) (held bool, err error) {
	var kids []string
	if err := zkCall(ctx, func() error { kids, _, err = m.c.Children(m.dir); return err }); err != nil {
		return false, err
	}
	slices.Sort(kids) // the same prefix and a 10-digit sequence: name order is sequence order
	mine := slices.Index(kids, filepath.Base(m.node))
	if mine < 0 {
		return false, fmt.Errorf("zookeeper: lock node %s gone (session expired?)", m.node)
	}
	if mine == 0 {
		return true, nil
	}
	var exists bool
	var gone <-chan zk.Event
	if err := zkCall(ctx, func() error { exists, _, gone, err = m.c.ExistsW(m.dir + "/" + kids[mine-1]); return err }); err != nil {
		return false, err
	}
	if !exists {
		return false, nil
	}
	select {
	case <-gone:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (m *zkMutex) unlock(ctx context.Context) error {
	return zkCall(ctx, func() error { return m.c.Delete(m.node, -1) })
}

// read creates one znode and reads it from a session on the leader: ZooKeeper's read is served from the
// server's own state, as a serializable read is; a linearizable one it has not (notApplicable).
func (s *zkSystem) read(ctx context.Context, clients int, serializable bool) (loadgen.Op, error) {
	if !serializable {
		return nil, notApplicable("ZooKeeper has no linearizable read (sync, then read, is not one)")
	}
	leader := s.leader(ctx)
	if leader < 0 {
		return nil, errors.New("no leader")
	}
	cs, err := s.sessions(ctx, 1, 10*time.Second, s.clientEps[leader:leader+1])
	if err != nil {
		return nil, err
	}
	path, err := s.parent(ctx, cs[0], "read")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, worker, _ int) error {
		return zkCall(ctx, func() error { _, _, err := cs[worker%len(cs)].Get(path); return err })
	}, nil
}

// renew has no ZooKeeper equivalent: a session's pings keep all its znodes, with no request per lock.
func (s *zkSystem) renew(context.Context, int) (loadgen.Op, error) {
	return nil, notApplicable("no per-lock renewal: a session's pings keep all its znodes")
}

// keepAlive likewise: what holds many locks is one session's ping, whatever their number.
func (s *zkSystem) keepAlive(context.Context, int, int, int) (loadgen.Op, error) {
	return nil, notApplicable("no per-lock renewal: one ping a session keeps all its znodes")
}
