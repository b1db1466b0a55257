package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/internal/ids"
	"github.com/leased/leased/server/internal/membership"
)

// discover is a new member's first contact with the cluster it joins (--initial-cluster-state existing):
// it asks the members given in InitialCluster, and those gossip finds through Config.Join (their peer
// ports' Join RPC), until one answers, and returns the leader's answer: the cluster id, this member's
// record and the member table. A member that was never added, or was removed, is refused at once with the
// reason; unreachable members are retried until Config.JoinTimeout.
//
// With rejoin, the request asks the leader to add this member back under a new raft id
// (internal/membership/rejoin.go).
func discover(cfg Config, g *membership.Gossip, rejoin bool) (*wirepb.JoinResponse, error) {
	var initial []string
	for name, addr := range cfg.InitialCluster {
		if name != cfg.Name {
			initial = append(initial, addr)
		}
	}
	slices.Sort(initial)
	if len(initial) == 0 && g == nil {
		return nil, errors.New("joining an existing cluster needs the peer address of at least one current member " +
			"(--initial-cluster NAME=HOST:PORT,...) or a gossip address to join (--join HOST:PORT)")
	}
	creds := insecure.NewCredentials()
	if cfg.PeerTLS != nil {
		creds = credentials.NewTLS(cfg.PeerTLS)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.joinTimeout())
	defer cancel()
	// No client address: the member announces it to the leader once it runs (Members.AnnounceLoop), where it
	// can prove that it is the member it names.
	req := &wirepb.JoinRequest{Name: cfg.Name}
	if rejoin {
		req.Rejoin, req.PeerAddr = true, membership.Advertised(cfg.AdvertisePeerAddr, cfg.PeerAddr)
	}
	var last error
	for {
		addrs := initial
		if g != nil {
			if len(cfg.Join) > 0 && g.Alone() {
				if err := g.Join(cfg.Join); err != nil {
					last = err
				}
			}
			addrs = append(slices.Clone(initial), g.PeerAddrs(0)...)
		}
		for _, addr := range addrs {
			resp, err := askJoin(ctx, addr, creds, req, cfg.joinCallTimeout())
			if err == nil {
				if err = checkToken(cfg, resp); err == nil {
					return checkJoinAnswer(cfg, resp)
				}
				// Not the cluster this node was told to join (a rogue, or another cluster's member): ask
				// the others, and never record its answer.
				last = fmt.Errorf("%s: %w", addr, err)
				cfg.Logger.Warn("refusing the cluster a member answered for", "addr", addr, "err", err)
				continue
			}
			if c := status.Code(err); c == codes.NotFound || c == codes.InvalidArgument || (rejoin && rejoinRefused(err)) {
				return nil, fmt.Errorf("join via %s: %s", addr, status.Convert(err).Message())
			}
			last = fmt.Errorf("%s: %w", addr, err)
			cfg.Logger.Info("no answer from a member yet; retrying", "addr", addr, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no member answered within %v (last: %v)", cfg.joinTimeout(), last)
		case <-time.After(cfg.ElectionTimeout()):
		}
	}
}

func askJoin(ctx context.Context, addr string, creds credentials.TransportCredentials, req *wirepb.JoinRequest, timeout time.Duration) (*wirepb.JoinResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return wirepb.NewRaftClient(conn).Join(actx, req)
}

// checkToken refuses an answer from a cluster other than the one --initial-cluster-token names (none
// given: any cluster).
func checkToken(cfg Config, resp *wirepb.JoinResponse) error {
	if cfg.InitialClusterToken == "" {
		return nil
	}
	if want := ids.TokenCluster(cfg.InitialClusterToken); resp.GetClusterId() != want {
		return fmt.Errorf("the answer is for cluster %s, but --initial-cluster-token %q names cluster %s",
			leasepb.FormatID(resp.GetClusterId()), cfg.InitialClusterToken, leasepb.FormatID(want))
	}
	return nil
}

func checkJoinAnswer(cfg Config, resp *wirepb.JoinResponse) (*wirepb.JoinResponse, error) {
	switch {
	case resp.GetRemoved() && !cfg.AutoRejoin:
		return nil, removedDirErr(cfg.DataDir, cfg.Name, "the cluster says so")
	case resp.GetRemoved():
		return resp, nil // identify adds it again
	}
	id := resp.GetMember().GetId()
	if resp.GetClusterId() == 0 || resp.GetMember().GetName() != cfg.Name || !ids.IsIncarnation(resp.GetClusterId(), cfg.Name, id) {
		return nil, fmt.Errorf("join answer for %q names member %q (%s) in cluster %s, which is not one of that name's raft ids",
			cfg.Name, resp.GetMember().GetName(), leasepb.FormatID(id), leasepb.FormatID(resp.GetClusterId()))
	}
	return resp, nil
}

// joinCallTimeout bounds one Join call: a rejoin makes two membership changes on the leader.
func (c Config) joinCallTimeout() time.Duration { return max(5*time.Second, 3*c.ProposalTimeout) }

// probePeers asks the peers of InitialCluster, before a founding start on an empty data dir, what they
// know of this member, each answering from its own member table (no leader needed: a founding member's
// record gets its client address only once it runs). It returns nil when no peer answered within two
// election timeouts — a new cluster's first start, when the others are not up yet — and an error when a
// peer's cluster has no member of this name.
func probePeers(cfg Config) (*wirepb.JoinResponse, error) {
	var peers []string
	for name, addr := range cfg.InitialCluster {
		if name != cfg.Name {
			peers = append(peers, addr)
		}
	}
	slices.Sort(peers)
	if len(peers) == 0 {
		return nil, nil
	}
	creds := insecure.NewCredentials()
	if cfg.PeerTLS != nil {
		creds = credentials.NewTLS(cfg.PeerTLS)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*cfg.ElectionTimeout())
	defer cancel()
	req := &wirepb.JoinRequest{Name: cfg.Name, Probe: true}
	for {
		for _, addr := range peers {
			resp, err := askJoin(ctx, addr, creds, req, cfg.ElectionTimeout())
			switch {
			case err == nil:
				return resp, nil
			case status.Code(err) == codes.NotFound:
				return nil, fmt.Errorf("peer %s of --initial-cluster: %s (does --initial-cluster name another cluster's members?)",
					addr, status.Convert(err).Message())
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(cfg.ElectionTimeout() / 4):
		}
	}
}

// ErrWipedMember is the refusal of a node that starts on an empty data dir while its cluster knows it as
// a member that has run: its data dir was lost.
var ErrWipedMember = errors.New("this member's data dir was lost")

// wipedErr is the refusal of a wiped member started without Config.AutoRejoin.
func wipedErr(cfg Config, resp *wirepb.JoinResponse) error {
	why := fmt.Sprintf("member %q (raft id %s) of cluster %s has run before", cfg.Name,
		leasepb.FormatID(resp.GetMember().GetId()), leasepb.FormatID(resp.GetClusterId()))
	if resp.GetRemoved() {
		why = fmt.Sprintf("member %q was removed from cluster %s", cfg.Name, leasepb.FormatID(resp.GetClusterId()))
	}
	return fmt.Errorf("%w: data dir %s is empty, but %s: an empty log must not take its place. "+
		"Follow the runbook \"Replace a failed node\" in docs/operations.md (remove it, add it again, start it "+
		"with --initial-cluster-state existing), or start it with --auto-rejoin to have it re-added under a new raft id",
		ErrWipedMember, cfg.DataDir, why)
}

// rejoinOrRefuse answers a first start whose cluster knows this member as one that has run (or removed):
// the refusal, or with Config.AutoRejoin the leader's answer to a rejoin.
func rejoinOrRefuse(cfg Config, g *membership.Gossip, known *wirepb.JoinResponse) (*wirepb.JoinResponse, error) {
	if !cfg.AutoRejoin {
		return nil, wipedErr(cfg, known)
	}
	cfg.Logger.Warn("the cluster knows this member, but its data dir is empty: asking to be added again under a new raft id (--auto-rejoin)",
		"cluster", leasepb.FormatID(known.GetClusterId()), "old_id", leasepb.FormatID(known.GetMember().GetId()), "removed", known.GetRemoved())
	resp, err := discover(cfg, g, true)
	if err == nil && resp.GetMember() == nil {
		err = errors.New("the leader's answer names no member")
	}
	if err != nil {
		return nil, fmt.Errorf("rejoin the cluster: %w", err)
	}
	return resp, nil
}

// rejoinRefused reports whether a Join error ends a rejoin for good (others, such as a removal refused
// while the leader still hears from the old id, are retried).
func rejoinRefused(err error) bool { return status.Code(err) == codes.PermissionDenied }
