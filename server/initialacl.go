package server

import (
	"fmt"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/lessor"
)

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
