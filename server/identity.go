package server

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
)

// Identity: a cluster's id is a hash of its --initial-cluster-token when it has one, else of its founding
// members (names and peer addresses), so every founding node computes the same id from the same flags,
// and a joining node with the token can tell the cluster it reaches is that one (discover.go); a node's
// raft id is a hash of its name within that cluster. Neither is ever zero (raft reserves 0 for "none").

// clusterIDOf is the id of the cluster cfg founds.
func clusterIDOf(cfg Config) uint64 {
	if cfg.InitialClusterToken != "" {
		return tokenClusterID(cfg.InitialClusterToken)
	}
	return clusterID(cfg.InitialCluster)
}

// tokenClusterID is the id of the cluster founded with token.
func tokenClusterID(token string) uint64 {
	return hashID("cluster-token:" + token)
}

func clusterID(initial map[string]string) uint64 {
	names := make([]string, 0, len(initial))
	for name := range initial {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		b.WriteString(name + "=" + initial[name] + ",")
	}
	return hashID("cluster:" + b.String())
}

func memberID(cluster uint64, name string) uint64 { return incarnationID(cluster, name, 0) }

// A name keeps its raft id for life, unless its member loses its data dir or is removed: the name may
// then be added again (leasectl member add, --auto-rejoin), under its next incarnation's id, and the old
// id stays retired for good (raft messages from it are refused). Incarnation 0 is the founding id.

// maxIncarnations bounds how many raft ids one name can have over a cluster's life (docs/design.md,
// "Limits"); it keeps the search of incarnationOf short.
const maxIncarnations = 1024

// incarnationID is the raft id of the k-th incarnation of the member called name.
func incarnationID(cluster uint64, name string, k int) uint64 {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], cluster)
	if k == 0 {
		return hashID("member:" + string(buf[:]) + name)
	}
	return hashID("member:" + string(buf[:]) + name + "#" + strconv.Itoa(k))
}

// isIncarnation reports whether id is one of name's raft ids in cluster.
func isIncarnation(cluster uint64, name string, id uint64) bool {
	for k := range maxIncarnations {
		if incarnationID(cluster, name, k) == id {
			return true
		}
	}
	return false
}

func hashID(s string) uint64 {
	sum := sha256.Sum256([]byte(s))
	if id := binary.BigEndian.Uint64(sum[:8]); id != 0 {
		return id
	}
	return 1
}
