package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/lessor"
)

// The ACL calls. Both need admin on the whole cluster, which the Cluster service's interceptor checks
// (internal/auth) before they run.

// AclGet answers the rules of the replicated state (linearizable unless serializable).
func (s *clusterService) AclGet(ctx context.Context, req *leasepb.AclGetRequest) (*leasepb.AclGetResponse, error) {
	resp := &leasepb.AclGetResponse{}
	err := s.n.ops.read(ctx, req.GetSerializable(), func(sm *fsm.FSM) {
		rules, set := sm.ACL()
		resp.Set = set
		for _, r := range rules {
			resp.Rules = append(resp.Rules, &leasepb.AclRule{Identity: r.GetIdentity(), Prefix: r.GetPrefix(),
				Permissions: append([]leasepb.Permission(nil), r.GetPermissions()...)})
		}
	})
	if err != nil {
		return nil, s.n.ops.status(err)
	}
	resp.Header = s.n.ops.header()
	return resp, nil
}

// AclSet replaces the rules through the log, on the leader. It refuses rules that break the limits, and
// rules that would take admin on the whole cluster from the identity that sets them: one typo must not
// leave nobody able to change the rules.
func (s *clusterService) AclSet(ctx context.Context, req *leasepb.AclSetRequest) (*leasepb.AclSetResponse, error) {
	n := s.n
	if err := acl.Validate(req.GetRules()); err != nil {
		var ae *acl.Error
		if errors.As(err, &ae) {
			return nil, n.ops.status(invalid(ae.Field, "%s", ae.Reason))
		}
		return nil, n.ops.status(invalid("rules", "%v", err))
	}
	id, err := n.authz.Identity(ctx)
	if err != nil {
		return nil, n.ops.status(err)
	}
	if id != "" && !acl.Allows(req.GetRules(), id, "", leasepb.Permission_PERMISSION_ADMIN) {
		return nil, n.ops.status(invalid("rules", "the new rules take admin on the whole cluster (prefix \"\") from %q, who sets them; "+
			"keep a rule that gives it admin, so that someone can still change the rules", id))
	}
	if !n.ops.isLeader() {
		return nil, n.ops.status(n.ops.notLeaderErr())
	}
	res, index, err := n.ops.propose(ctx, &wirepb.Command{Op: &wirepb.Command_SetAcl{SetAcl: &wirepb.SetAclCmd{Rules: req.GetRules()}}})
	if err != nil {
		return nil, n.ops.status(err)
	}
	if res.Code != fsm.OK {
		return nil, n.ops.status(invalid("rules", "the state machine refused them (%v)", res.Code))
	}
	return &leasepb.AclSetResponse{Header: n.ops.header(), Index: index}, nil
}

// proposeInitialACL proposes Config.InitialACL when this node became leader and finds no rules ever set.
// The entry is marked initial, so it applies only while no rules are set: leaders that each propose theirs
// (this one may not have applied a predecessor's yet) set them once. Called from the Ready loop: it hands
// the command to the lessor's proposer without blocking.
func (n *node) proposeInitialACL() {
	var set bool
	n.state.Read(func(sm *fsm.FSM) { _, set = sm.ACL() })
	if set {
		return
	}
	if n.cfg.InitialACL == nil {
		if n.cfg.ClientCertAuth {
			n.log.Warn("client certificates are required and the cluster has no ACL rules: every request is refused until an admin sets them " +
				"(found the cluster with --initial-acl-file)")
		}
		return
	}
	cmd := &wirepb.Command{Op: &wirepb.Command_SetAcl{SetAcl: &wirepb.SetAclCmd{Rules: n.cfg.InitialACL, Initial: true}}}
	if n.lessor.Send(lessor.Cmd{Term: n.raft.Term(), Cmd: cmd}) {
		n.log.Info("proposing the initial ACL", "rules", len(n.cfg.InitialACL))
	} else {
		n.log.Warn(fmt.Sprintf("the proposer queue is full; the initial ACL waits for the next leader change (%d rules)", len(n.cfg.InitialACL)))
	}
}
