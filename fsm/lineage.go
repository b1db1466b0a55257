package fsm

// Lineage: which cluster a state belongs to, and how many restores are behind it. Both travel in every
// snapshot, so a backup file says where it came from (leasectl snapshot status).
//
// The cluster id is not applied from the log: every member of a cluster knows it from its identity and
// records it with SetClusterID whenever it builds or replaces its state machine, so it is the same on
// every member and snapshots stay equal across members at equal indexes. A restore records the new
// cluster's id the same way.
//
// The generation is replicated state: 0 for a cluster founded by flags, and one more than the backup's
// for a cluster founded from it (Rebase). Nothing the state machine decides depends on either.

// ClusterID is the id of the cluster this state belongs to; 0 if none was ever recorded (a snapshot of an
// earlier version, or a state no node has claimed).
func (f *FSM) ClusterID() uint64 { return f.clusterID }

// Generation is the number of restores behind this state.
func (f *FSM) Generation() uint64 { return f.generation }

// SetClusterID records the id of the cluster this state belongs to.
func (f *FSM) SetClusterID(id uint64) { f.clusterID = id }
