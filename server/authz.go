package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// Authorization (decision 10). Every check reads the ACL from the replicated state, so every node applies
// the same rules from the index that set them; with no identity (ClientCertAuth off) nothing is checked.
//
//   - read: Get, List, Watch, ValidateToken. List and Watch need read on the requested prefix (a rule
//     whose prefix is a prefix of it), so a listing never mixes resources the identity may and may not
//     read; a Watch is authorized when it starts.
//   - lease: Acquire; Renew, KeepAlive, Release and Proclaim of the identity's own leases.
//   - admin: Renew, KeepAlive, Release and Proclaim of another identity's lease (or of one granted without an
//     identity); with prefix "", every Cluster call but Status (members, snapshots, AclGet, AclSet).
//
// Writes are checked on the leader against its state (the state machine checks Acquire and Release again
// when it applies them, fsm/acl.go); reads on the node that serves them, in the same FSM read as the data.

var (
	// ErrUnauthenticated: the node requires a client certificate identity and the request had none.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the identity lacks a permission the call needs.
	ErrPermissionDenied = errors.New("permission denied")
)

// accessError is an Unauthenticated (detail.identity empty) or PermissionDenied answer.
type accessError struct {
	detail *leasepb.AccessDenied
	reason string
}

func (e *accessError) Error() string { return e.reason }

func (e *accessError) Is(target error) bool {
	if e.detail.GetIdentity() == "" {
		return target == ErrUnauthenticated
	}
	return target == ErrPermissionDenied
}

func unauthenticated(reason string) error {
	return &accessError{detail: &leasepb.AccessDenied{}, reason: "unauthenticated: " + reason}
}

// denied builds the PermissionDenied answer of a Denial: the identity, the permission, where, and why.
func denied(d fsm.Denial, rulesSet bool) error {
	where := fmt.Sprintf("on %q", d.Resource)
	if d.Resource == "" {
		where = "on the whole cluster (prefix \"\")"
	}
	msg := fmt.Sprintf("permission denied: identity %q lacks permission %s %s", d.Identity, acl.Name(d.Permission), where)
	if d.Permission == leasepb.Permission_PERMISSION_ADMIN && d.Resource != "" {
		owner := "no identity (granted without client certificates)"
		if d.Owner != "" {
			owner = fmt.Sprintf("identity %q", d.Owner)
		}
		msg += fmt.Sprintf(": the lease belongs to %s", owner)
	}
	if !rulesSet {
		msg += "; the cluster has no ACL rules (found it with --initial-acl-file)"
	}
	return &accessError{reason: msg, detail: &leasepb.AccessDenied{
		Identity: d.Identity, Permission: d.Permission, Resource: d.Resource, Owner: d.Owner}}
}

// need returns nil if identity has one of perms on scope, else the PermissionDenied naming the first.
func need(sm *fsm.FSM, identity, scope string, perms ...leasepb.Permission) error {
	if identity == "" {
		return nil
	}
	for _, p := range perms {
		if sm.Allows(identity, scope, p) {
			return nil
		}
	}
	_, set := sm.ACL()
	return denied(fsm.Denial{Identity: identity, Permission: perms[0], Resource: scope}, set)
}

// mayTouch checks a renewal or release of (resource, token): the owner needs lease (or admin), anyone
// else admin. A token that is not current needs what the resource's own leases would.
func mayTouch(sm *fsm.FSM, identity, resource string, token uint64) error {
	if identity == "" {
		return nil
	}
	if l, ok := sm.Current(resource, token); ok && l.Identity != identity {
		if sm.Allows(identity, resource, leasepb.Permission_PERMISSION_ADMIN) {
			return nil
		}
		_, set := sm.ACL()
		return denied(fsm.Denial{Identity: identity, Permission: leasepb.Permission_PERMISSION_ADMIN, Resource: resource, Owner: l.Identity}, set)
	}
	return need(sm, identity, resource, leasepb.Permission_PERMISSION_LEASE, leasepb.Permission_PERMISSION_ADMIN)
}

// authorizeWrite checks a write against this node's (the leader's) state before anything is proposed or
// renewed.
func (n *node) authorizeWrite(req *wirepb.ForwardRequest) error {
	id := req.GetIdentity()
	if id == "" {
		return nil
	}
	var err error
	n.readFSM(func(sm *fsm.FSM) {
		switch r := req.GetRequest().(type) {
		case *wirepb.ForwardRequest_Acquire:
			err = need(sm, id, r.Acquire.GetResource(), leasepb.Permission_PERMISSION_LEASE)
		case *wirepb.ForwardRequest_Renew:
			err = mayTouch(sm, id, r.Renew.GetResource(), r.Renew.GetToken())
		case *wirepb.ForwardRequest_Release:
			err = mayTouch(sm, id, r.Release.GetResource(), r.Release.GetToken())
		case *wirepb.ForwardRequest_Proclaim:
			err = mayTouch(sm, id, r.Proclaim.GetResource(), r.Proclaim.GetToken())
		case *wirepb.ForwardRequest_KeepAlive:
			for _, ref := range r.KeepAlive.GetLeases() {
				if err = mayTouch(sm, id, ref.GetResource(), ref.GetToken()); err != nil {
					return
				}
			}
		}
	})
	return err
}

// rulesSet reports whether the cluster's ACL rules were ever set, for the wording of a denial.
func (n *node) rulesSet() bool {
	var set bool
	n.readFSM(func(sm *fsm.FSM) { _, set = sm.ACL() })
	return set
}

// authorizeRead checks read on scope against this node's state (for Watch, which reads no lease).
func (n *node) authorizeRead(identity, scope string) error {
	var err error
	n.readFSM(func(sm *fsm.FSM) { err = need(sm, identity, scope, leasepb.Permission_PERMISSION_READ) })
	return err
}

// visible is the wire form of a lease as identity may see it: with identities on, the request id is
// shown only to the identity that holds the lease (decision 10), blank to any other.
func visible(l fsm.Lease, identity string, identities bool) *leasepb.Lease {
	p := l.Proto()
	if identities && l.Identity != identity {
		p.RequestId = ""
	}
	return p
}

// visibleEvents is events as identity may see them (visible); the shared events are not changed.
func visibleEvents(events []fsm.Event, identity string, identities bool) []fsm.Event {
	if !identities {
		return events
	}
	out := make([]fsm.Event, len(events))
	for i, e := range events {
		if e.Lease.Identity != identity {
			e.Lease.RequestID = ""
		}
		out[i] = e
	}
	return out
}

// clusterMethodPrefix begins the gRPC method names of the Cluster service.
var clusterMethodPrefix = "/" + leasepb.Cluster_ServiceDesc.ServiceName + "/"

// openClusterMethods need no permission: Status answers during an outage and says nothing of leases.
var openClusterMethods = map[string]bool{leasepb.Cluster_Status_FullMethodName: true}

// adminOnly reports whether a gRPC method needs admin on the whole cluster.
func adminOnly(method string) bool {
	return strings.HasPrefix(method, clusterMethodPrefix) && !openClusterMethods[method]
}

// authorizeAdmin checks that the caller of ctx has admin on the whole cluster (prefix "").
func (n *node) authorizeAdmin(ctx context.Context) (string, error) {
	id, err := n.identityOf(ctx)
	if err != nil || id == "" {
		return id, err
	}
	var aerr error
	n.readFSM(func(sm *fsm.FSM) { aerr = need(sm, id, "", leasepb.Permission_PERMISSION_ADMIN) })
	return id, aerr
}

// unaryAuthz refuses Cluster calls (but Status) from identities without admin, before the handler runs:
// membership, snapshots and ACLs are guarded in one place, whoever implements them.
func (n *node) unaryAuthz(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if adminOnly(info.FullMethod) {
		if _, err := n.authorizeAdmin(ctx); err != nil {
			return nil, n.status(err)
		}
	}
	return handler(ctx, req)
}

func (n *node) streamAuthz(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if adminOnly(info.FullMethod) {
		if _, err := n.authorizeAdmin(ss.Context()); err != nil {
			return n.status(err)
		}
	}
	return handler(srv, ss)
}
