package client

import (
	"context"

	"github.com/leased/leased/api/leasepb"
)

// The cluster's ACL (docs/security.md, "Identities and ACLs"): rules in the replicated state, read and
// replaced by identities with admin on the whole cluster. api/acl parses and writes the YAML form.

// ACL returns the cluster's rules and whether any were ever set (a cluster founded without
// --initial-acl-file has none, and with client certificates required refuses every call).
func (c *Client) ACL(ctx context.Context) ([]*leasepb.AclRule, bool, error) {
	resp, err := clusterCall(ctx, c, func(ctx context.Context, cl leasepb.ClusterClient) (*leasepb.AclGetResponse, error) {
		return cl.AclGet(ctx, &leasepb.AclGetRequest{})
	})
	if err != nil {
		return nil, false, err
	}
	c.endpoints.follow(resp.GetHeader())
	return resp.GetRules(), resp.GetSet(), nil
}

// SetACL replaces every rule through the log and returns the index of the entry that set them; each node
// enforces them from when it applies that entry. Replacing rules is idempotent, so the call is retried
// like the lease writes. The server refuses (ErrInvalid) rules that break the limits, or that take admin
// on the whole cluster from the identity setting them.
func (c *Client) SetACL(ctx context.Context, rules []*leasepb.AclRule) (uint64, error) {
	resp, err := clusterCall(ctx, c, func(ctx context.Context, cl leasepb.ClusterClient) (*leasepb.AclSetResponse, error) {
		return cl.AclSet(ctx, &leasepb.AclSetRequest{Rules: rules})
	})
	if err != nil {
		return 0, err
	}
	c.endpoints.follow(resp.GetHeader())
	return resp.GetIndex(), nil
}
