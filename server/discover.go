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
)

// discover is a new member's first contact with the cluster it joins (--initial-cluster-state existing):
// it asks the members given in InitialCluster, and those gossip finds through Config.Join (their peer
// ports' Join RPC), until one answers, and returns the leader's answer: the cluster id, this member's
// record and the member table. A member that was never added, or was removed, is refused at once with the
// reason; unreachable members are retried until Config.JoinTimeout.
func discover(cfg Config, g *gossip) (*wirepb.JoinResponse, error) {
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
	// No client address: the member announces it to the leader once it runs (announceLoop), where it
	// can prove that it is the member it names.
	req := &wirepb.JoinRequest{Name: cfg.Name}
	var last error
	for {
		addrs := initial
		if g != nil {
			if len(cfg.Join) > 0 && g.ml.NumMembers() < 2 {
				if err := g.join(cfg.Join); err != nil {
					last = err
				}
			}
			addrs = append(slices.Clone(initial), g.peerAddrs(0)...)
		}
		for _, addr := range addrs {
			resp, err := askJoin(ctx, addr, creds, req)
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
			if c := status.Code(err); c == codes.NotFound || c == codes.InvalidArgument {
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

func askJoin(ctx context.Context, addr string, creds credentials.TransportCredentials, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return wirepb.NewRaftClient(conn).Join(actx, req)
}

// checkToken refuses an answer from a cluster other than the one --initial-cluster-token names (none
// given: any cluster).
func checkToken(cfg Config, resp *wirepb.JoinResponse) error {
	if cfg.InitialClusterToken == "" {
		return nil
	}
	if want := tokenClusterID(cfg.InitialClusterToken); resp.GetClusterId() != want {
		return fmt.Errorf("the answer is for cluster %s, but --initial-cluster-token %q names cluster %s",
			leasepb.FormatID(resp.GetClusterId()), cfg.InitialClusterToken, leasepb.FormatID(want))
	}
	return nil
}

func checkJoinAnswer(cfg Config, resp *wirepb.JoinResponse) (*wirepb.JoinResponse, error) {
	if resp.GetRemoved() {
		return nil, removedDirErr(cfg.DataDir, cfg.Name, "the cluster says so")
	}
	want := memberID(resp.GetClusterId(), cfg.Name)
	if resp.GetClusterId() == 0 || resp.GetMember().GetId() != want {
		return nil, fmt.Errorf("join answer for %q names member %s in cluster %s; expected %s",
			cfg.Name, leasepb.FormatID(resp.GetMember().GetId()), leasepb.FormatID(resp.GetClusterId()), leasepb.FormatID(want))
	}
	return resp, nil
}
