package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/leased/leased/server"
)

// envPrefix is prepended to a flag's name, upper-cased with '-' turned into '_', to give the environment
// variable that sets it: --data-dir is LEASED_DATA_DIR. A flag on the command line wins over the variable.
const envPrefix = "LEASED_"

// notFromEnv are the flags no environment variable sets: LEASED_VERSION is a common name for the version
// a deployment runs (an image tag), and must not turn a node into a process that prints its version.
var notFromEnv = map[string]bool{"version": true, "help-all": true}

// options is everything the command line decides: the node's configuration plus what only the binary
// needs (the admin listener, the logger, --version).
type options struct {
	cfg         server.Config
	adminAddr   string
	logLevel    slog.Level
	logFormat   string
	auditLog    string // --audit-log: "stderr", "off" or a file path
	showVersion bool
	helpAll     bool   // --help-all
	configFile  string // --config-file
	// electionTimeout is --election-timeout, which sets cfg's raft timing unless the detailed flags do.
	electionTimeout time.Duration
	tls             tlsOptions
	// gossipKeyFile is read by main into cfg.GossipKey.
	gossipKeyFile string
}

// usageError is a problem with the command line itself (unknown flag, unparsable value). main exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// errHelp reports that --help was asked for and the usage was printed; main exits 0.
var errHelp = errors.New("help requested")

// envName is the environment variable that sets a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags turns the command line, the environment (looked up with getenv) and the --config-file into
// options: a flag on the command line wins over its variable, which wins over the file (configfile.go).
// It does not validate the resulting server.Config: server.New does, and main reports that as a
// configuration error. On --help or --help-all it writes the usage to stdout and returns errHelp; a bad
// flag, variable or file is a usageError.
func parseFlags(args []string, getenv func(string) string, stdout io.Writer) (options, error) {
	o := defaultOptions()
	fs := newFlagSet(&o)
	// The environment first, so that the command line, parsed next, overrides it; the file last, for
	// what neither set.
	if err := applyEnv(fs, getenv); err != nil {
		return o, err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, false)
			return o, errHelp
		}
		return o, usageError{dashDash(err)}
	}
	if fs.NArg() > 0 {
		return o, usageError{fmt.Errorf("unexpected argument %q (every setting is a --flag)", fs.Arg(0))}
	}
	if o.helpAll {
		printUsage(stdout, fs, true)
		return o, errHelp
	}
	if o.configFile != "" {
		if err := applyConfigFile(fs, o.configFile); err != nil {
			return o, err
		}
	}
	return o, applyElectionTimeout(&o, fs)
}

// applyEnv sets every flag whose variable getenv has.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if notFromEnv[f.Name] {
			return
		}
		v := getenv(envName(f.Name))
		if v == "" || err != nil {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = usageError{fmt.Errorf("invalid value %q for %s: %v", v, envName(f.Name), e)}
		}
	})
	return err
}

func defaultOptions() options {
	cfg := server.DefaultConfig()
	return options{cfg: cfg, logLevel: slog.LevelInfo, logFormat: "text", auditLog: "stderr", electionTimeout: cfg.ElectionTimeout()}
}

// newFlagSet defines every flag of leased on o.
func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("leased", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned as one line; --help is printed by printUsage
	c, l := &o.cfg, &o.cfg.Limits

	fs.StringVar(&c.Name, "name", "", "this node's name; a founding node's must be one of the names in --initial-cluster, a joining node's the name given to leasectl member add (required)")
	fs.StringVar(&c.DataDir, "data-dir", "", "directory of the raft log; it belongs to one cluster and one node for life (required)")
	fs.StringVar(&c.ClientAddr, "client-addr", "127.0.0.1:7101", "host:port serving the gRPC Leases and Cluster services to clients")
	fs.StringVar(&c.PeerAddr, "peer-addr", "127.0.0.1:7201", "host:port serving raft traffic from the other nodes")
	fs.StringVar(&c.HTTPAddr, "http-addr", "", "host:port serving the Leases service as HTTP/JSON (docs/http.md), with the client port's TLS and client certificate rules; empty (the default) turns it off")
	fs.StringVar(&o.adminAddr, "admin-addr", "127.0.0.1:7401", "host:port of the admin HTTP server (/healthz, /readyz, /metrics); loopback by default, empty disables it")
	fs.StringVar(&c.AdvertiseClientAddr, "advertise-client-addr", "", "host:port clients reach this node's client address at (member table, leader hints, status); default --client-addr, which must then not be 0.0.0.0 or [::]")
	fs.StringVar(&c.AdvertisePeerAddr, "advertise-peer-addr", "", "host:port other nodes reach this node's peer address at; default --peer-addr, which must then not be 0.0.0.0 or [::]")
	fs.StringVar(&o.configFile, "config-file", "", "YAML `file` of settings, keyed by flag name (docs/operations.md, \"Configuration file\"); the command line and the environment win over it")
	fs.BoolVar(&o.helpAll, "help-all", false, "list every flag, the limits and tuning ones too, and exit")
	fs.DurationVar(&o.electionTimeout, "election-timeout", o.electionTimeout, "how long a follower waits without hearing from a leader before it campaigns (the raft tick is this over --election-ticks); "+
		"the TTL floor is 8 election timeouts. The same on every node")
	fs.Var((*clusterFlag)(&c.InitialCluster), "initial-cluster", "the founding `members` as name=peer-host:port,... (comma-separated); identical on every founding node. "+
		"With --initial-cluster-state existing: some current members, asked for the cluster. Read on the first start only: after it, the member table in the data dir is the authority (required on a first start)")
	fs.StringVar(&c.GossipAddr, "gossip-addr", "", "host:port for memberlist gossip (node discovery and metadata; it never changes who votes); empty disables gossip")
	fs.StringVar(&c.AdvertiseGossipAddr, "advertise-gossip-addr", "", "host:port other nodes reach this node's gossip address at; default --gossip-addr, which must then not be 0.0.0.0 or [::]")
	fs.Var(listFlag{&c.Join}, "join", "gossip `addresses` host:port,... of members to join; with --initial-cluster-state existing, a new member finds the cluster through them (no --initial-cluster needed)")
	fs.StringVar(&o.gossipKeyFile, "gossip-key-file", "", "file holding the base64 of a 16, 24 or 32 byte key that encrypts gossip (the same on every node); without it gossip stays on loopback unless --insecure-gossip")
	fs.BoolVar(&c.InsecureGossip, "insecure-gossip", false, "allow unencrypted gossip (no --gossip-key-file) on a non-loopback address (anyone who reaches it can join the pool and gossip false addresses; a warning is logged at every start)")
	fs.StringVar(&c.InitialClusterToken, "initial-cluster-token", "", "`token` naming the cluster, the same on every node: a founding node derives the cluster id from it, a joining node accepts only the cluster it names (needed to join through unencrypted gossip). First start only")
	fs.DurationVar(&c.JoinTimeout, "join-timeout", c.JoinTimeout, "how long a joining node's first start waits for a member to answer")
	fs.BoolVar(&c.AutoRejoin, "auto-rejoin", false, "on an empty data dir whose cluster knows this member as one that has run (a lost volume), "+
		"ask to be added again as a learner under a new raft id instead of refusing to start (for StatefulSets)")
	fs.Var(stateFlag{&c.InitialClusterState}, "initial-cluster-state", "`state` on a first start: new (found the cluster in --initial-cluster) or existing (join a cluster that added this node with leasectl member add)")
	fs.Var(&aclFileFlag{rules: &c.InitialACL}, "initial-acl-file", "YAML `file` of the ACL rules a new cluster starts with (docs/security.md); used only while the cluster has no rules, ignored once any are set")

	fs.DurationVar(&c.TickInterval, "tick", c.TickInterval, "raft tick interval: the detailed alternative to --election-timeout, which is --tick × --election-ticks")
	fs.IntVar(&c.ElectionTicks, "election-ticks", c.ElectionTicks, "ticks without a leader before a follower campaigns")
	fs.IntVar(&c.HeartbeatTicks, "heartbeat-ticks", c.HeartbeatTicks, "ticks between leader heartbeats")
	fs.Uint64Var(&c.SnapshotEntries, "snapshot-entries", c.SnapshotEntries, "applied entries between snapshots and log compactions (the voters stagger theirs over the interval)")
	fs.Uint64Var(&c.SnapshotCatchUp, "snapshot-catchup", c.SnapshotCatchUp, "entries kept after compaction for slow followers")
	fs.DurationVar(&c.CheckpointInterval, "checkpoint-interval", c.CheckpointInterval, "how often the leader checkpoints remaining lease TTLs")
	fs.IntVar(&c.ExpiryBatch, "expiry-batch", c.ExpiryBatch, "most leases expired by one log entry")
	fs.IntVar(&c.ExpiryRate, "expiry-rate", c.ExpiryRate, "most leases the leader expires per second (a mass expiry is spread out at this rate)")
	fs.IntVar(&c.WatchHistory, "watch-history", c.WatchHistory, "events kept for Watch to resume from")
	fs.Int64Var(&c.WatchHistoryBytes, "watch-history-bytes", c.WatchHistoryBytes, "bytes of events kept for Watch to resume from (the history stops at this or --watch-history, whichever comes first)")
	fs.DurationVar(&c.ProposalTimeout, "proposal-timeout", c.ProposalTimeout, "how long a write waits for its entry to apply")
	fs.DurationVar(&c.DiskStallTimeout, "disk-stall-timeout", c.DiskStallTimeout, "how long one raft log write may take before the node stops (exit status 1); at least twice the election timeout")

	fs.IntVar(&l.MaxResourceBytes, "max-resource-bytes", l.MaxResourceBytes, "longest resource name")
	fs.IntVar(&l.MaxHolderBytes, "max-holder-bytes", l.MaxHolderBytes, "longest holder name")
	fs.IntVar(&l.MaxValueBytes, "max-value-bytes", l.MaxValueBytes, "largest lease value")
	fs.DurationVar(&l.MinTTL, "min-ttl", l.MinTTL, "shortest lease TTL a client may ask for; 0 is the TTL floor, 8 × the election timeout (a lease must outlast a leader failover); a value below the floor is refused")
	fs.DurationVar(&l.MaxTTL, "max-ttl", l.MaxTTL, "longest lease TTL a client may ask for")
	fs.DurationVar(&l.MaxLockDelay, "max-lock-delay", l.MaxLockDelay, "longest lock-delay a client may ask for")
	fs.IntVar(&l.MaxLeasesPerHolder, "max-leases-per-holder", l.MaxLeasesPerHolder, "most leases one holder may hold (with --client-cert-auth, within one identity)")
	fs.IntVar(&l.MaxRequestBytes, "max-request-bytes", l.MaxRequestBytes, "largest gRPC message a client may send")
	fs.IntVar(&l.MaxKeepAliveLeases, "max-keepalive-leases", l.MaxKeepAliveLeases, "most leases one KeepAlive message may renew")
	fs.IntVar(&l.MaxListLimit, "max-list-limit", l.MaxListLimit, "largest List page")
	fs.IntVar(&l.MaxWatchers, "max-watchers", l.MaxWatchers, "most Watch streams this node serves")
	fs.IntVar(&l.MaxWatchersPerConn, "max-watchers-per-conn", l.MaxWatchersPerConn, "most Watch streams one client connection holds")
	fs.IntVar(&l.MaxWaiters, "max-waiters", l.MaxWaiters, "most blocking acquires the leader queues")
	fs.IntVar(&l.MaxWaitersPerResource, "max-waiters-per-resource", l.MaxWaitersPerResource, "most blocking acquires queued for one resource")
	fs.IntVar(&l.MaxStreamsPerConn, "max-streams-per-conn", l.MaxStreamsPerConn, "most concurrent calls (streams and unary) on one client connection")
	fs.IntVar(&l.MaxLeases, "max-leases", l.MaxLeases, "most live leases in the cluster; past it grants of free resources are refused")
	fs.IntVar(&l.MaxLeasesPerIdentity, "max-leases-per-identity", l.MaxLeasesPerIdentity, "with --client-cert-auth, most live leases one identity may hold in the cluster; 0 is a quarter of --max-leases")
	fs.IntVar(&l.MaxWatchersPerIdentity, "max-watchers-per-identity", l.MaxWatchersPerIdentity, "with --client-cert-auth, most Watch streams one identity holds on this node; 0 is a quarter of --max-watchers")
	fs.IntVar(&l.MaxWaitersPerIdentity, "max-waiters-per-identity", l.MaxWaitersPerIdentity, "with --client-cert-auth, most blocking acquires of one identity the leader queues; 0 is a quarter of --max-waiters")
	fs.Int64Var(&l.QuotaBytesPerIdentity, "quota-bytes-per-identity", l.QuotaBytesPerIdentity, "with --client-cert-auth, state size one identity's leases may reach before its grants of free resources are refused; 0 is a quarter of --quota-bytes")
	fs.IntVar(&l.MaxConnections, "max-connections", l.MaxConnections, "most connections the client and HTTP ports hold together (one more is closed on accept); 0 sizes it to the descriptor limit: three quarters of RLIMIT_NOFILE less 256, at most 16384")
	fs.DurationVar(&l.MaxConnectionIdle, "max-connection-idle", l.MaxConnectionIdle, "close a client or HTTP connection with no call open for this long (and one whose handshake takes longer, up to 10s)")
	fs.Int64Var(&l.QuotaBytes, "quota-bytes", l.QuotaBytes, "state size (live leases and lock-delays) at which grants of free resources are refused while renewals, releases and reads go on")

	addTLSFlags(fs, &o.tls)

	fs.Var((*levelFlag)(&o.logLevel), "log-level", "log `level`: debug, info, warn or error")
	fs.Var(formatFlag{&o.logFormat}, "log-format", "log `format`: text or json")
	fs.StringVar(&o.auditLog, "audit-log", o.auditLog, "where the audit trail (a line per grant, release and expiry, written by the leader) goes: stderr (with the log), off, or a `file` to append to; at --log-level and --log-format")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")

	return fs
}

// dashDash spells flags in the flag package's errors the way --help does (--name, not -name).
func dashDash(err error) error {
	msg := strings.NewReplacer("flag -", "flag --", ": -", ": --").Replace(err.Error())
	return errors.New(msg)
}

// essentialFlags are the flags `leased --help` lists: what most deployments set (names, addresses,
// bootstrap, TLS, logs, timing). The others — limits and tuning — keep their defaults in most
// deployments; `leased --help-all` lists them, and they are as valid as these on the command line, in
// the environment and in the --config-file.
var essentialFlags = map[string]bool{
	"name": true, "data-dir": true, "config-file": true,
	"client-addr": true, "peer-addr": true, "http-addr": true, "admin-addr": true,
	"advertise-client-addr": true, "advertise-peer-addr": true,
	"initial-cluster": true, "initial-cluster-state": true, "initial-cluster-token": true,
	"gossip-addr": true, "join": true, "gossip-key-file": true,
	"cert-file": true, "key-file": true, "trusted-ca-file": true, "client-cert-auth": true,
	"peer-cert-file": true, "peer-key-file": true, "peer-trusted-ca-file": true,
	"election-timeout": true, "log-level": true, "log-format": true, "enable-pprof": true, "version": true,
}

// printUsage writes the usage: the essential flags, or with all every flag.
func printUsage(w io.Writer, fs *flag.FlagSet, all bool) {
	fmt.Fprintf(w, `leased is one node of a leased cluster: a lease and fencing-token server on Raft.

Usage:
  leased --name NAME --data-dir DIR --initial-cluster NAME=HOST:PORT,... [flags]     found a cluster
  leased --name NAME --data-dir DIR --initial-cluster-state existing \
         (--initial-cluster NAME=HOST:PORT,... | --gossip-addr HOST:PORT --join HOST:PORT,...) [flags]
                                                    join one after leasectl member add NAME
  leased health [--admin-addr HOST:PORT] [--live] [--timeout D]   (see leased health --help)

Every flag but --version and --help-all can also be set with an environment variable: LEASED_ and the
flag's name in upper snake case (--data-dir is LEASED_DATA_DIR), or in the YAML --config-file under its
name (data-dir: /var/lib/leased). The command line wins over the variable, the variable over the file.

`)
	if all {
		fmt.Fprintln(w, "Flags:")
	} else {
		fmt.Fprintln(w, "Flags (the essentials: leased --help-all lists every flag, the limits and tuning too, and\ndocs/operations.md, \"Configuration file\", says how to set them in a file):")
	}
	fs.VisitAll(func(f *flag.Flag) {
		if all || essentialFlags[f.Name] {
			printFlag(w, f)
		}
	})
	fmt.Fprint(w, `
Exit status: 0 after a clean shutdown (SIGTERM or SIGINT) or --help / --version; 1 on a configuration
error or a fatal error of the node (for example a failed disk); 2 on a bad flag, variable or config file.
`)
}

func printFlag(w io.Writer, f *flag.Flag) {
	name, usage := flag.UnquoteUsage(f)
	if name != "" {
		name = " " + name
	}
	fmt.Fprintf(w, "  --%s%s\n    \t%s", f.Name, name, usage)
	if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
		fmt.Fprintf(w, " (default %s)", f.DefValue)
	}
	if notFromEnv[f.Name] {
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, " [$%s]\n", envName(f.Name))
}

// applyElectionTimeout turns --election-timeout, when it is set, into the raft tick: the election timeout
// divided by --election-ticks (10 by default), so that the heartbeat (--heartbeat-ticks, 1) keeps its share
// of it. --tick is the detailed alternative; both at once is an error.
func applyElectionTimeout(o *options, fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["election-timeout"] {
		return nil
	}
	if set["tick"] {
		return usageError{errors.New("--election-timeout and --tick both set the raft tick: give one")}
	}
	if o.cfg.ElectionTicks <= 0 {
		return nil // server.Config.Validate says why
	}
	tick := o.electionTimeout / time.Duration(o.cfg.ElectionTicks)
	if tick < time.Millisecond {
		return usageError{fmt.Errorf("--election-timeout %v over %d election ticks is a tick of %v: want at least 1ms", o.electionTimeout, o.cfg.ElectionTicks, tick)}
	}
	o.cfg.TickInterval = tick
	return nil
}

// clusterFlag parses --initial-cluster: name=host:port pairs separated by commas. Names and addresses must
// be unique.
type clusterFlag map[string]string

func (c *clusterFlag) String() string {
	if c == nil || len(*c) == 0 {
		return ""
	}
	return formatCluster(*c)
}

func formatCluster(m map[string]string) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + m[n]
	}
	return strings.Join(parts, ",")
}

func (c *clusterFlag) Set(s string) error {
	m, err := parseCluster(s)
	if err != nil {
		return err
	}
	*c = m
	return nil
}

func parseCluster(s string) (map[string]string, error) {
	m := make(map[string]string)
	byAddr := make(map[string]string)
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, errors.New("empty member (want name=host:port,...)")
		}
		name, addr, ok := strings.Cut(item, "=")
		name, addr = strings.TrimSpace(name), strings.TrimSpace(addr)
		if !ok || name == "" || addr == "" {
			return nil, fmt.Errorf("member %q is not name=host:port", item)
		}
		if err := checkHostPort(addr); err != nil {
			return nil, fmt.Errorf("member %s: %w", name, err)
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("member name %s appears twice", name)
		}
		if other, dup := byAddr[addr]; dup {
			return nil, fmt.Errorf("members %s and %s have the same address %s", other, name, addr)
		}
		m[name], byAddr[addr] = addr, name
	}
	return m, nil
}

func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: want host:port", addr)
	}
	if host == "" {
		return fmt.Errorf("address %q has no host (peers must be able to dial it)", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("address %q: port must be 1..65535", addr)
	}
	return nil
}

// listFlag parses a comma-separated list of host:port addresses (--join).
type listFlag struct{ p *[]string }

func (f listFlag) String() string {
	if f.p == nil {
		return ""
	}
	return strings.Join(*f.p, ",")
}

func (f listFlag) Set(s string) error {
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if err := checkHostPort(a); err != nil {
			return err
		}
		out = append(out, a)
	}
	*f.p = out
	return nil
}

// stateFlag parses --initial-cluster-state.
type stateFlag struct{ p *string }

func (f stateFlag) String() string {
	if f.p == nil || *f.p == "" {
		return server.ClusterStateNew
	}
	return *f.p
}

func (f stateFlag) Set(s string) error {
	switch s {
	case server.ClusterStateNew, server.ClusterStateExisting:
		*f.p = s
		return nil
	}
	return errors.New("want new or existing")
}

// levelFlag parses --log-level.
type levelFlag slog.Level

func (l *levelFlag) String() string { return strings.ToLower(slog.Level(*l).String()) }

func (l *levelFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "debug":
		*l = levelFlag(slog.LevelDebug)
	case "info":
		*l = levelFlag(slog.LevelInfo)
	case "warn":
		*l = levelFlag(slog.LevelWarn)
	case "error":
		*l = levelFlag(slog.LevelError)
	default:
		return errors.New("want debug, info, warn or error")
	}
	return nil
}

// formatFlag parses --log-format.
type formatFlag struct{ p *string }

func (f formatFlag) String() string {
	if f.p == nil {
		return ""
	}
	return *f.p
}

func (f formatFlag) Set(s string) error {
	switch s {
	case "text", "json":
		*f.p = s
		return nil
	}
	return errors.New("want text or json")
}

// newLogger builds the slog logger the options ask for, writing to w.
func newLogger(o options, w io.Writer) *slog.Logger {
	h := &slog.HandlerOptions{Level: o.logLevel}
	if o.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, h))
	}
	return slog.New(slog.NewTextHandler(w, h))
}
