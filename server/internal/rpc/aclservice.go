package rpc

import (
	"context"
	"errors"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// The ACL calls. Both need admin on the whole cluster, which the Cluster service's interceptor checks
// (internal/auth) before they run.

// AclGet answers the rules of the replicated state (linearizable unless serializable).
func (s *clusterService) AclGet(ctx context.Context, req *leasepb.AclGetRequest) (*leasepb.AclGetResponse, error) {
	resp := &leasepb.AclGetResponse{}
	err := s.o.read(ctx, req.GetSerializable(), func(sm *fsm.FSM) {
		rules, set := sm.ACL()
		resp.Set = set
		for _, r := range rules {
			resp.Rules = append(resp.Rules, &leasepb.AclRule{Identity: r.GetIdentity(), Prefix: r.GetPrefix(),
				Permissions: append([]leasepb.Permission(nil), r.GetPermissions()...)})
		}
	})
	if err != nil {
		return nil, s.o.Status(err)
	}
	resp.Header = s.o.header()
	return resp, nil
}

// AclSet replaces the rules through the log, on the leader. It refuses rules that break the limits, and
// rules that would take admin on the whole cluster from the identity that sets them: one typo must not
// leave nobody able to change the rules.
func (s *clusterService) AclSet(ctx context.Context, req *leasepb.AclSetRequest) (*leasepb.AclSetResponse, error) {
	o := s.o
	if err := acl.Validate(req.GetRules()); err != nil {
		var ae *acl.Error
		if errors.As(err, &ae) {
			return nil, o.Status(invalid(ae.Field, "%s", ae.Reason))
		}
		return nil, o.Status(invalid("rules", "%v", err))
	}
	id, err := o.authz.Identity(ctx)
	if err != nil {
		return nil, o.Status(err)
	}
	if id != "" && !acl.Allows(req.GetRules(), id, "", leasepb.Permission_PERMISSION_ADMIN) {
		return nil, o.Status(invalid("rules", "the new rules take admin on the whole cluster (prefix \"\") from %q, who sets them; "+
			"keep a rule that gives it admin, so that someone can still change the rules", id))
	}
	if !o.IsLeader() {
		return nil, o.Status(o.NotLeaderErr())
	}
	res, index, err := o.Propose(ctx, &wirepb.Command{Op: &wirepb.Command_SetAcl{SetAcl: &wirepb.SetAclCmd{Rules: req.GetRules()}}})
	if err != nil {
		return nil, o.Status(err)
	}
	if res.Code != fsm.OK {
		return nil, o.Status(invalid("rules", "the state machine refused them (%v)", res.Code))
	}
	return &leasepb.AclSetResponse{Header: o.header(), Index: index}, nil
}
