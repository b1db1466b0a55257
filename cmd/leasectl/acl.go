package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// The acl commands read and replace the cluster's ACL rules (client.ACL, client.SetACL), in the YAML
// format of --initial-acl-file (api/acl). Both need admin on the whole cluster.

func (a *app) aclCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "acl",
		Short: "Show or replace the cluster's ACL rules (admin only)",
		Long: `acl get prints the cluster's ACL rules as YAML, in the format of leased's --initial-acl-file; acl set FILE
replaces every rule with the file's, through the replicated log, so every node enforces them from then on
without a restart. The file is validated before anything is sent (a bad file changes nothing and exits 2).
Both need an identity with admin on the prefix "" (docs/security.md, "Identities and ACLs").`,
		Example: `  leasectl acl get > acl.yaml
  leasectl acl set acl.yaml --cacert ca.pem --cert ops.pem --key ops-key.pem`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef(cmd, "unknown acl command %q (want get or set)", args[0])
			}
			return usagef(cmd, "missing acl command (get or set)")
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	get := &cobra.Command{
		Use:     "get",
		Short:   "Print the cluster's ACL rules as YAML",
		Example: `  leasectl acl get`,
		Args:    noArgs,
		RunE: a.body(func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			return a.withClient("", func(c *client.Client) error {
				rules, set, err := c.ACL(ctx)
				if err != nil {
					return fmt.Errorf("acl get: %w", err)
				}
				return a.printACL(rules, set)
			})
		}),
	}
	set := &cobra.Command{
		Use:     "set FILE",
		Short:   "Replace the cluster's ACL rules with those of a YAML file",
		Example: `  leasectl acl set acl.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef(cmd, "want one FILE of rules, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return usagef(cmd, "%v", err)
			}
			rules, err := acl.Parse(data)
			if err != nil {
				return usagef(cmd, "%s: %v", args[0], err)
			}
			return a.body(func(cmd *cobra.Command, _ []string) error {
				ctx, cancel := a.requestContext(cmd.Context())
				defer cancel()
				return a.withClient("", func(c *client.Client) error {
					index, err := c.SetACL(ctx, rules)
					if err != nil {
						return fmt.Errorf("acl set: %w", err)
					}
					if a.jsonOut() {
						return a.emitJSON(map[string]any{"rules": len(rules), "index": index})
					}
					fmt.Fprintf(a.stdout, "set %d rules at index %d\n", len(rules), index)
					return nil
				})
			})(cmd, args)
		},
	}
	cmd.AddCommand(get, set)
	return cmd
}

// printACL prints rules as YAML, or with -o json as one object {"set": ..., "rules": [...]}.
func (a *app) printACL(rules []*leasepb.AclRule, set bool) error {
	if a.jsonOut() {
		resp := &leasepb.AclGetResponse{Rules: rules, Set: set}
		b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(resp)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%s\n", b)
		return nil
	}
	if !set {
		fmt.Fprintln(a.stderr, "leasectl: the cluster has no ACL rules (with client certificates required, it refuses every call)")
	}
	out, err := acl.Marshal(rules)
	if err != nil {
		return err
	}
	_, err = a.stdout.Write(out)
	return err
}
