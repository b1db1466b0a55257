//go:build plantoldpeer

package transport

// plantedNoFallback plants a bug for tests/chaos: a peer that serves only the gRPC raft stream (an older
// version) is never sent to on it, so a cluster of mixed builds loses the old nodes. Built only with
// -tags plantoldpeer; the chaos run's mixed-build checker must catch it.
const plantedNoFallback = true
