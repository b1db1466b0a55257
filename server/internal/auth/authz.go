// Package auth decides who a client is and what it may do (decision 10): the identity its verified
// certificate names (Authorizer.Identity), the ACL checks against the replicated state, which it reads
// only through a read view the node hands it, and the gRPC interceptors that guard the Cluster service.
// With client certificate authentication off there is no identity and nothing is checked. It also keeps
// the audit trail of who was granted, released and lost which lease, and of ACL changes (AuditTrail).
package auth

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

// AccessError is an Unauthenticated (Detail.identity empty) or PermissionDenied answer.
type AccessError struct {
	Detail *leasepb.AccessDenied
	reason string
}

func (e *AccessError) Error() string { return e.reason }

func (e *AccessError) Is(target error) bool {
	if e.Detail.GetIdentity() == "" {
		return target == ErrUnauthenticated
	}
	return target == ErrPermissionDenied
}

// Unauthenticated is the answer to a request without the identity the node requires.
func Unauthenticated(reason string) error {
	return &AccessError{Detail: &leasepb.AccessDenied{}, reason: "unauthenticated: " + reason}
}

// Denied builds the PermissionDenied answer of a Denial: the identity, the permission, where, and why.
func Denied(d fsm.Denial, rulesSet bool) error {
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
	return &AccessError{reason: msg, Detail: &leasepb.AccessDenied{
		Identity: d.Identity, Permission: d.Permission, Resource: d.Resource, Owner: d.Owner}}
}

// Need returns nil if identity has one of perms on scope, else the PermissionDenied naming the first.
func Need(sm *fsm.FSM, identity, scope string, perms ...leasepb.Permission) error {
	if identity == "" {
		return nil
	}
	for _, p := range perms {
		if sm.Allows(identity, scope, p) {
			return nil
		}
	}
	_, set := sm.ACL()
	return Denied(fsm.Denial{Identity: identity, Permission: perms[0], Resource: scope}, set)
}

// MayTouch checks a renewal or release of (resource, token): the owner needs lease (or admin), anyone
// else admin. A token that is not current needs what the resource's own leases would.
func MayTouch(sm *fsm.FSM, identity, resource string, token uint64) error {
	if identity == "" {
		return nil
	}
	if l, ok := sm.Current(resource, token); ok && l.Identity != identity {
		if sm.Allows(identity, resource, leasepb.Permission_PERMISSION_ADMIN) {
			return nil
		}
		_, set := sm.ACL()
		return Denied(fsm.Denial{Identity: identity, Permission: leasepb.Permission_PERMISSION_ADMIN, Resource: resource, Owner: l.Identity}, set)
	}
	return Need(sm, identity, resource, leasepb.Permission_PERMISSION_LEASE, leasepb.Permission_PERMISSION_ADMIN)
}

// Authorizer checks requests against the ACL rules of the node's state.
type Authorizer struct {
	identities bool                    // client certificates required (--client-cert-auth)
	read       func(fn func(*fsm.FSM)) // runs fn on the node's state, under its read lock
	status     func(error) error       // the gRPC status of an error, for the interceptors
}

// New returns an Authorizer. read runs fn on the node's current state machine, which fn must not keep;
// status turns a refusal into the gRPC status the interceptors answer with.
func New(clientCertAuth bool, read func(fn func(*fsm.FSM)), status func(error) error) *Authorizer {
	return &Authorizer{identities: clientCertAuth, read: read, status: status}
}

// AuthorizeWrite checks a write against this node's (the leader's) state before anything is proposed or
// renewed.
func (a *Authorizer) AuthorizeWrite(req *wirepb.ForwardRequest) error {
	id := req.GetIdentity()
	if id == "" {
		return nil
	}
	var err error
	a.read(func(sm *fsm.FSM) {
		switch r := req.GetRequest().(type) {
		case *wirepb.ForwardRequest_Acquire:
			err = Need(sm, id, r.Acquire.GetResource(), leasepb.Permission_PERMISSION_LEASE)
		case *wirepb.ForwardRequest_Renew:
			err = MayTouch(sm, id, r.Renew.GetResource(), r.Renew.GetToken())
		case *wirepb.ForwardRequest_Release:
			err = MayTouch(sm, id, r.Release.GetResource(), r.Release.GetToken())
		case *wirepb.ForwardRequest_Proclaim:
			err = MayTouch(sm, id, r.Proclaim.GetResource(), r.Proclaim.GetToken())
		case *wirepb.ForwardRequest_KeepAlive:
			for _, ref := range r.KeepAlive.GetLeases() {
				if err = MayTouch(sm, id, ref.GetResource(), ref.GetToken()); err != nil {
					return
				}
			}
		}
	})
	return err
}

// RulesSet reports whether the cluster's ACL rules were ever set, for the wording of a denial.
func (a *Authorizer) RulesSet() bool {
	var set bool
	a.read(func(sm *fsm.FSM) { _, set = sm.ACL() })
	return set
}

// AuthorizeRead checks read on scope against this node's state (for Watch, which reads no lease).
func (a *Authorizer) AuthorizeRead(identity, scope string) error {
	var err error
	a.read(func(sm *fsm.FSM) { err = Need(sm, identity, scope, leasepb.Permission_PERMISSION_READ) })
	return err
}

// Visible is the wire form of a lease as identity may see it: with identities on, the request id is
// shown only to the identity that holds the lease (decision 10), blank to any other.
func Visible(l fsm.Lease, identity string, identities bool) *leasepb.Lease {
	p := l.Proto()
	if identities && l.Identity != identity {
		p.RequestId = ""
	}
	return p
}

// VisibleEvents is events as identity may see them (Visible); the shared events are not changed.
func VisibleEvents(events []fsm.Event, identity string, identities bool) []fsm.Event {
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

// AuthorizeAdmin checks that the caller of ctx has admin on the whole cluster (prefix "").
func (a *Authorizer) AuthorizeAdmin(ctx context.Context) (string, error) {
	id, err := a.Identity(ctx)
	if err != nil || id == "" {
		return id, err
	}
	var aerr error
	a.read(func(sm *fsm.FSM) { aerr = Need(sm, id, "", leasepb.Permission_PERMISSION_ADMIN) })
	return id, aerr
}

// Unary refuses Cluster calls (but Status) from identities without admin, before the handler runs:
// membership, snapshots and ACLs are guarded in one place, whoever implements them.
func (a *Authorizer) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if adminOnly(info.FullMethod) {
		if _, err := a.AuthorizeAdmin(ctx); err != nil {
			return nil, a.status(err)
		}
	}
	return handler(ctx, req)
}

// Stream is Unary for streaming calls.
func (a *Authorizer) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if adminOnly(info.FullMethod) {
		if _, err := a.AuthorizeAdmin(ss.Context()); err != nil {
			return a.status(err)
		}
	}
	return handler(srv, ss)
}
