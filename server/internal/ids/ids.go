// Package ids derives the raft ids of clusters and members: a cluster's id is a hash of its
// --initial-cluster-token when it has one, else of its founding members (names and peer addresses), so
// every founding node computes the same id from the same flags, and a joining node with the token can tell
// the cluster it reaches is that one; a node's raft id is a hash of its name within that cluster. Neither
// is ever zero (raft reserves 0 for "none"). The ids are recorded in data dirs and backups, so they never
// change for the same input. Both the node and the offline restore derive them here.
package ids

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
)

// TokenCluster is the id of the cluster founded with token.
func TokenCluster(token string) uint64 {
	return Hash("cluster-token:" + token)
}

// Cluster is the id of the cluster founded by initial, name -> peer address, without a token.
func Cluster(initial map[string]string) uint64 {
	names := make([]string, 0, len(initial))
	for name := range initial {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		b.WriteString(name + "=" + initial[name] + ",")
	}
	return Hash("cluster:" + b.String())
}

// Member is the founding raft id of the member called name in cluster.
func Member(cluster uint64, name string) uint64 { return Incarnation(cluster, name, 0) }

// A name keeps its raft id for life, unless its member loses its data dir or is removed: the name may
// then be added again (leasectl member add, --auto-rejoin), under its next incarnation's id, and the old
// id stays retired for good (raft messages from it are refused). Incarnation 0 is the founding id.

// MaxIncarnations bounds how many raft ids one name can have over a cluster's life (docs/design.md,
// "Limits"); it keeps the search of IsIncarnation short.
const MaxIncarnations = 1024

// Incarnation is the raft id of the k-th incarnation of the member called name.
func Incarnation(cluster uint64, name string, k int) uint64 {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], cluster)
	if k == 0 {
		return Hash("member:" + string(buf[:]) + name)
	}
	return Hash("member:" + string(buf[:]) + name + "#" + strconv.Itoa(k))
}

// IsIncarnation reports whether id is one of name's raft ids in cluster.
func IsIncarnation(cluster uint64, name string, id uint64) bool {
	for k := range MaxIncarnations {
		if Incarnation(cluster, name, k) == id {
			return true
		}
	}
	return false
}

// Hash is the id of s: the first 8 bytes of its sha256, never 0.
func Hash(s string) uint64 {
	sum := sha256.Sum256([]byte(s))
	if id := binary.BigEndian.Uint64(sum[:8]); id != 0 {
		return id
	}
	return 1
}
