package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// The member commands are the SDK's Cluster-service calls (client.MemberList, ...): the SDK finds the
// leader, follows its hints and retries, as for every other command. The snapshot commands are in
// snapshot.go.

func (a *app) memberCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List and change the cluster's Raft members",
		Long: `member lists the Raft configuration and changes it: new nodes join as learners (add) and become voters
once caught up (promote); remove takes a node out. These are explicit operator actions; gossip never changes
who votes. (The server answers these once membership changes are implemented; until then they exit 1 with
the server's answer.)`,
		Example: `  leasectl member list
  leasectl member add n4 --peer-addr 10.0.0.4:7201 --client-addr 10.0.0.4:7101
  leasectl member promote 4
  leasectl member remove 4`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef(cmd, "unknown member command %q (want list, add, promote or remove)", args[0])
			}
			return usagef(cmd, "missing member command (list, add, promote or remove)")
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}

	list := &cobra.Command{
		Use:     "list",
		Short:   "List the members of the Raft configuration",
		Example: `  leasectl member list -o json`,
		Args:    noArgs,
		RunE: a.body(func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			return a.withClient("", func(c *client.Client) error {
				members, err := c.MemberList(ctx)
				if err != nil {
					return fmt.Errorf("member list: %w", err)
				}
				return a.printMembers(members)
			})
		}),
	}

	var peerAddr, clientAddr string
	add := &cobra.Command{
		Use:     "add NAME --peer-addr HOST:PORT [--client-addr HOST:PORT]",
		Short:   "Add a node as a non-voting learner",
		Example: `  leasectl member add n4 --peer-addr 10.0.0.4:7201 --client-addr 10.0.0.4:7101`,
		Args:    nameArg,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireFlags(cmd, "peer-addr"); err != nil {
				return err
			}
			if _, err := parseEndpoints(peerAddr); err != nil || peerAddr == "" {
				return usagef(cmd, "--peer-addr must be host:port")
			}
			if clientAddr != "" {
				if _, err := parseEndpoints(clientAddr); err != nil {
					return usagef(cmd, "--client-addr must be host:port")
				}
			}
			return nil
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			return a.withClient("", func(c *client.Client) error {
				members, err := c.MemberAdd(ctx, args[0], peerAddr, clientAddr)
				if err != nil {
					return fmt.Errorf("member add: %w", err)
				}
				return a.printMembers(members)
			})
		}),
	}
	add.Flags().StringVar(&peerAddr, "peer-addr", "", "address the new node receives raft traffic on (required)")
	add.Flags().StringVar(&clientAddr, "client-addr", "", "address the new node serves clients on")
	_ = add.MarkFlagRequired("peer-addr")

	idCommand := func(use, short, example string, rpc func(*client.Client, context.Context, uint64) ([]client.Member, error)) *cobra.Command {
		return &cobra.Command{
			Use: use + " ID", Short: short, Example: example,
			Args: func(cmd *cobra.Command, args []string) error {
				if len(args) != 1 {
					return usagef(cmd, "expected one member ID")
				}
				if id, err := leasepb.ParseID(args[0]); err != nil || id == 0 {
					return usagef(cmd, "member ID must be a non-zero hex id as member list prints it, got %q", args[0])
				}
				return nil
			},
			RunE: a.body(func(cmd *cobra.Command, args []string) error {
				id, _ := leasepb.ParseID(args[0])
				ctx, cancel := a.requestContext(cmd.Context())
				defer cancel()
				return a.withClient("", func(c *client.Client) error {
					members, err := rpc(c, ctx, id)
					if err != nil {
						return fmt.Errorf("member %s %s: %w", use, leasepb.FormatID(id), err)
					}
					return a.printMembers(members)
				})
			}),
		}
	}
	promote := idCommand("promote", "Make a caught-up learner a voter", `  leasectl member promote 4`, (*client.Client).MemberPromote)
	remove := idCommand("remove", "Remove a member from the Raft configuration", `  leasectl member remove 4`, (*client.Client).MemberRemove)
	cmd.AddCommand(list, add, promote, remove)
	return cmd
}

func nameArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 || args[0] == "" {
		return usagef(cmd, "expected one NAME")
	}
	return nil
}

// memberJSON is the shape of the member commands' JSON output, one line per member.
type memberJSON struct {
	ID         string `json:"id"` // leasepb.FormatID: ids use all 64 bits, more than a JSON number keeps
	Name       string `json:"name"`
	PeerAddr   string `json:"peer_addr"`
	ClientAddr string `json:"client_addr"`
	IsLearner  bool   `json:"is_learner"`
}

func (a *app) printMembers(ms []client.Member) error {
	if a.jsonOut() {
		for _, m := range ms {
			if err := a.emitJSON(memberJSON{ID: leasepb.FormatID(m.ID), Name: m.Name, PeerAddr: m.PeerAddr,
				ClientAddr: m.ClientAddr, IsLearner: m.IsLearner}); err != nil {
				return err
			}
		}
		return nil
	}
	t := a.newTable("ID", "NAME", "PEER ADDRESS", "CLIENT ADDRESS", "LEARNER")
	for _, m := range ms {
		t.row(leasepb.FormatID(m.ID), m.Name, m.PeerAddr, orDash(m.ClientAddr), strconv.FormatBool(m.IsLearner))
	}
	return t.flush()
}
