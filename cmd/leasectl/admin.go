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
once caught up (the leader promotes a learner by itself once it has kept up for a few election timeouts;
promote does it by hand); remove takes a node out (a removed node stops, and its data dir never serves
again). One change at a time. These are explicit operator actions; nothing else changes who votes.
promote and remove take a member's NAME or its ID as member list prints it.`,
		Example: `  leasectl member list
  leasectl member add n4 --peer-addr 10.0.0.4:7201 --client-addr 10.0.0.4:7101
  leasectl member promote n4
  leasectl member remove n4`,
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
				if err := a.printMembers(members); err != nil {
					return err
				}
				if !a.jsonOut() {
					a.warnf("start %s with --initial-cluster-state existing and --initial-cluster listing current members (NAME=PEER-ADDR,...); "+
						"it joins as a learner and is promoted once caught up", args[0])
				}
				return nil
			})
		}),
	}
	add.Flags().StringVar(&peerAddr, "peer-addr", "", "address the new node receives raft traffic on (required)")
	add.Flags().StringVar(&clientAddr, "client-addr", "", "address the new node serves clients on")
	_ = add.MarkFlagRequired("peer-addr")

	idCommand := func(use, short, example string, rpc func(*client.Client, context.Context, uint64) ([]client.Member, error)) *cobra.Command {
		return &cobra.Command{
			Use: use + " NAME|ID", Short: short, Example: example,
			Args: func(cmd *cobra.Command, args []string) error {
				if len(args) != 1 || args[0] == "" {
					return usagef(cmd, "expected one member NAME or ID")
				}
				return nil
			},
			RunE: a.body(func(cmd *cobra.Command, args []string) error {
				ctx, cancel := a.requestContext(cmd.Context())
				defer cancel()
				return a.withClient("", func(c *client.Client) error {
					id, err := resolveMember(ctx, c, args[0])
					if err != nil {
						return fmt.Errorf("member %s: %w", use, err)
					}
					members, err := rpc(c, ctx, id)
					if err != nil {
						return fmt.Errorf("member %s %s: %w", use, leasepb.FormatID(id), err)
					}
					return a.printMembers(members)
				})
			}),
		}
	}
	promote := idCommand("promote", "Make a caught-up learner a voter", `  leasectl member promote n4`, (*client.Client).MemberPromote)
	remove := idCommand("remove", "Remove a member from the Raft configuration (the leader hands over first)", `  leasectl member remove n4`, (*client.Client).MemberRemove)
	cmd.AddCommand(list, add, promote, remove)
	return cmd
}

func nameArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 || args[0] == "" {
		return usagef(cmd, "expected one NAME")
	}
	return nil
}

// resolveMember finds a member by name, or else by its hex id as member list prints it.
func resolveMember(ctx context.Context, c *client.Client, arg string) (uint64, error) {
	members, err := c.MemberList(ctx)
	if err != nil {
		return 0, err
	}
	for _, m := range members {
		if m.Name == arg {
			return m.ID, nil
		}
	}
	if id, err := leasepb.ParseID(arg); err == nil && id != 0 {
		return id, nil // an id the server knows, or NotFound from it
	}
	return 0, fmt.Errorf("%w: no member named %q (and it is no hex id)", client.ErrNotFound, arg)
}

// memberJSON is the shape of the member commands' JSON output, one line per member.
type memberJSON struct {
	ID         string `json:"id"` // leasepb.FormatID: ids use all 64 bits, more than a JSON number keeps
	Name       string `json:"name"`
	PeerAddr   string `json:"peer_addr"`
	ClientAddr string `json:"client_addr"`
	IsLearner  bool   `json:"is_learner"`
	IsLeader   bool   `json:"is_leader"`
}

func (a *app) printMembers(ms []client.Member) error {
	if a.jsonOut() {
		for _, m := range ms {
			if err := a.emitJSON(memberJSON{ID: leasepb.FormatID(m.ID), Name: m.Name, PeerAddr: m.PeerAddr,
				ClientAddr: m.ClientAddr, IsLearner: m.IsLearner, IsLeader: m.IsLeader}); err != nil {
				return err
			}
		}
		return nil
	}
	t := a.newTable("ID", "NAME", "PEER ADDRESS", "CLIENT ADDRESS", "LEARNER", "LEADER")
	for _, m := range ms {
		t.row(leasepb.FormatID(m.ID), m.Name, m.PeerAddr, orDash(m.ClientAddr), strconv.FormatBool(m.IsLearner), strconv.FormatBool(m.IsLeader))
	}
	return t.flush()
}
