package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// nodeJSON is the shape of status's JSON output, one line per endpoint. Ids are strings of 16 hex digits
// (leasepb.FormatID): they use all 64 bits, more than a JSON number keeps. "" means none known.
type nodeJSON struct {
	Name         string `json:"name"`
	ID           string `json:"id"`
	ClientAddr   string `json:"client_addr"`
	Role         string `json:"role"`
	Term         uint64 `json:"term"`
	Leader       string `json:"leader"`
	LeaderID     string `json:"leader_id"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	DBSizeBytes  int64  `json:"db_size_bytes"`
	LiveLeases   uint64 `json:"live_leases"`
	Version      string `json:"version"`
	// LoopStalledMS is how long the node's raft loop has not run, once longer than an election timeout.
	LoopStalledMS uint64 `json:"loop_stalled_ms"`
	Healthy       bool   `json:"healthy"`
	Error         string `json:"error,omitempty"`
}

func roleName(r leasepb.Role) string {
	switch r {
	case leasepb.Role_ROLE_LEADER:
		return "leader"
	case leasepb.Role_ROLE_FOLLOWER:
		return "follower"
	case leasepb.Role_ROLE_LEARNER:
		return "learner"
	case leasepb.Role_ROLE_CANDIDATE, leasepb.Role_ROLE_PRE_CANDIDATE:
		return "candidate"
	}
	return "unknown"
}

func (a *app) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show every endpoint's node: role, term, leader, indexes, size, health",
		Long: `status asks every endpoint about its node (in parallel; this needs no leader) and prints one row per
endpoint: name, client address, role (leader, follower, learner, candidate, or unreachable), term, the
leader it follows, commit and applied index, data file size, version and health. A node is healthy when it
answered, knows a leader and its raft loop runs (a node whose loop has not run for an election timeout, a
blocked disk write say, is "unhealthy: loop stalled"; a stalled leader names no leader). status exits with
code 5 when no reachable node knows a leader.`,
		Example: `  leasectl status
  leasectl status -o json | jq -r 'select(.role == "leader") | .client_addr'`,
		Args: noArgs,
		RunE: a.body(func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			return a.withClient("", func(c *client.Client) error {
				rows := make([]nodeJSON, len(a.endpoints))
				sts := make([]*client.NodeStatus, len(a.endpoints))
				var wg sync.WaitGroup
				for i, ep := range a.endpoints {
					wg.Go(func() {
						st, err := c.Status(ctx, ep)
						if err != nil {
							rows[i] = nodeJSON{ClientAddr: ep, Role: "unreachable", Error: message(err)}
							return
						}
						sts[i] = st
					})
				}
				wg.Wait()
				names := map[uint64]string{}
				for _, st := range sts {
					if st != nil {
						names[st.GetId()] = st.GetName()
					}
				}
				haveLeader := false
				for i, st := range sts {
					if st != nil {
						rows[i] = statusRow(st, names, a.endpoints[i])
						haveLeader = haveLeader || st.GetLeaderId() != 0
					}
				}
				if err := a.printStatus(rows); err != nil {
					return err
				}
				if !haveLeader {
					return fmt.Errorf("no reachable node knows a leader (%s): %w", unreachableSummary(rows), client.ErrUnavailable)
				}
				return nil
			})
		}),
	}
}

// statusRow is the row of a node's Status answer to endpoint; names are the answering nodes' names by id.
func statusRow(st *client.NodeStatus, names map[uint64]string, endpoint string) nodeJSON {
	leader := names[st.GetLeaderId()]
	if leader == "" && st.GetLeaderId() != 0 {
		leader = orDash(st.GetHeader().GetLeaderAddr())
		if leader == "-" {
			leader = leasepb.FormatID(st.GetLeaderId())
		}
	}
	addr := st.GetClientAddr()
	if addr == "" {
		addr = endpoint
	}
	return nodeJSON{
		Name: st.GetName(), ID: idOrNone(st.GetId()), ClientAddr: addr, Role: roleName(st.GetRole()),
		Term: st.GetTerm(), Leader: leader, LeaderID: idOrNone(st.GetLeaderId()),
		CommitIndex: st.GetCommitIndex(), AppliedIndex: st.GetAppliedIndex(),
		DBSizeBytes: st.GetDbSizeBytes(), LiveLeases: st.GetLiveLeases(), Version: st.GetVersion(),
		LoopStalledMS: st.GetLoopStalledMs(), Healthy: st.GetLeaderId() != 0 && st.GetLoopStalledMs() == 0,
	}
}

// idOrNone spells a raft id, or "" for 0 (no such node known).
func idOrNone(id uint64) string {
	if id == 0 {
		return ""
	}
	return leasepb.FormatID(id)
}

func unreachableSummary(rows []nodeJSON) string {
	n := 0
	for _, r := range rows {
		if r.Role == "unreachable" {
			n++
		}
	}
	return fmt.Sprintf("%d of %d endpoints unreachable", n, len(rows))
}

func (a *app) printStatus(rows []nodeJSON) error {
	if a.jsonOut() {
		var errs []error
		for _, r := range rows {
			errs = append(errs, a.emitJSON(r))
		}
		return errors.Join(errs...)
	}
	t := a.newTable("NAME", "ID", "ADDRESS", "ROLE", "TERM", "LEADER", "COMMIT", "APPLIED", "DB SIZE", "LEASES", "VERSION", "HEALTH")
	for _, r := range rows {
		if r.Role == "unreachable" {
			t.row("-", "-", r.ClientAddr, r.Role, "-", "-", "-", "-", "-", "-", "-", "unhealthy: "+strings.TrimSpace(r.Error)) // whole: the cause is what the operator acts on
			continue
		}
		health := "healthy"
		switch {
		case r.LoopStalledMS > 0:
			health = fmt.Sprintf("unhealthy: loop stalled %v", (time.Duration(r.LoopStalledMS) * time.Millisecond).Round(100*time.Millisecond))
		case !r.Healthy:
			health = "unhealthy: no leader"
		}
		t.row(orDash(r.Name), orDash(r.ID), r.ClientAddr, r.Role, strconv.FormatUint(r.Term, 10), orDash(r.Leader),
			strconv.FormatUint(r.CommitIndex, 10), strconv.FormatUint(r.AppliedIndex, 10), bytesHuman(r.DBSizeBytes),
			strconv.FormatUint(r.LiveLeases, 10), orDash(r.Version), health)
	}
	return t.flush()
}
