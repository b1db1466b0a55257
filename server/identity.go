package server

import "github.com/leased/leased/server/internal/ids"

// Identity: the ids of clusters and members derive from the flags that found them (server/internal/ids).

// clusterIDOf is the id of the cluster cfg founds.
func clusterIDOf(cfg Config) uint64 {
	if cfg.InitialClusterToken != "" {
		return ids.TokenCluster(cfg.InitialClusterToken)
	}
	return ids.Cluster(cfg.InitialCluster)
}
