// Package deploy checks the operator artifacts in deploy/ against the metrics contract of issue #15: the
// Grafana dashboard (deploy/grafana/leased.json) and the Prometheus alerting rules
// (deploy/prometheus/alerts.yaml) may only query series the server exports, and the dashboard shows every
// one of them. The rules' behaviour is promtool's to test (deploy/prometheus/alerts_test.yaml, run by
// scripts/promtool.sh); this package checks names and structure, and needs no promtool.
package deploy

import "strings"

type kind int

const (
	counter kind = iota
	gauge
	histogram
)

// nodeMetrics is the contract's list of the series a node exports (server/, served at /metrics on the
// admin address), from the contract of issue #15. TestContractIsWhatANodeExports (live_test.go) gathers
// a running cluster's registries and fails if this list and what the server exports drift apart.
var nodeMetrics = map[string]kind{
	"leased_build_info":                  gauge,
	"leased_has_leader":                  gauge,
	"leased_is_leader":                   gauge,
	"leased_loop_stalled_seconds":        gauge,
	"leased_ready":                       gauge,
	"leased_disk_free_bytes":             gauge,
	"leased_leader_changes_total":        counter,
	"leased_leader_stream_lost_total":    counter,
	"leased_term":                        gauge,
	"leased_proposals_total":             counter,
	"leased_disk_fsync_duration_seconds": histogram,
	"leased_apply_duration_seconds":      histogram,
	"leased_raft_log_entries":            gauge,
	"leased_db_size_bytes":               gauge,
	"leased_snapshot_size_bytes":         gauge,
	"leased_snapshot_duration_seconds":   histogram,
	"leased_live_leases":                 gauge,
	"leased_waiters":                     gauge,
	"leased_watchers":                    gauge,
	"leased_open_streams":                gauge,
	"leased_keepalive_batch_size":        histogram,
	"leased_batch_writes":                histogram,
	"leased_expiry_lag_seconds":          histogram,
	"leased_peer_round_trip_seconds":     histogram,
	"leased_peer_send_failures_total":    counter,
	"leased_peer_messages_dropped_total": counter,
	"leased_renewals_total":              counter,
	"leased_read_index_duration_seconds": histogram,
	"leased_events_total":                counter,
	"leased_commit_index":                gauge,
	"leased_applied_index":               gauge,
	"leased_quota_bytes":                 gauge,
	"leased_quota_used_bytes":            gauge,
	"leased_quota_exceeded":              gauge,
	"leased_connections":                 gauge,
	"leased_connections_refused_total":   counter,
	// go-grpc-middleware v2 providers/prometheus, on the client port, with the handling-time histogram.
	"grpc_server_handled_total":      counter,
	"grpc_server_handling_seconds":   histogram,
	"grpc_server_started_total":      counter,
	"grpc_server_msg_received_total": counter,
	"grpc_server_msg_sent_total":     counter,
}

// sdkMetrics are the client SDK's (only when client.Config.Registerer is set), exported by applications,
// not nodes: queries may name them, the node dashboard need not show them.
var sdkMetrics = map[string]kind{
	"leased_client_requests_total":             counter,
	"leased_client_request_duration_seconds":   histogram,
	"leased_client_leases_held":                gauge,
	"leased_client_leases_lost_total":          counter,
	"leased_client_renewal_round_trip_seconds": histogram,
}

// pendingMetrics are named by an alert before any node exports them. Only alerts.yaml may use them (the
// alert stays inactive until then); the dashboard may not. None at the moment.
var pendingMetrics = map[string]kind{}

// prometheusMetrics are series Prometheus makes itself for every scrape target.
var prometheusMetrics = map[string]kind{
	"up": gauge,
}

// seriesNames returns the names a query can select for the given metrics: a histogram's _bucket, _sum
// and _count (its bare name is no series), every other metric's own name. Each maps to its metric.
func seriesNames(sets ...map[string]kind) map[string]string {
	out := map[string]string{}
	for _, set := range sets {
		for name, k := range set {
			if k == histogram {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					out[name+suffix] = name
				}
				continue
			}
			out[name] = name
		}
	}
	return out
}

// unknown says why a name a query selects is not a series of the contract.
func unknown(name string) string {
	for _, set := range []map[string]kind{nodeMetrics, sdkMetrics, pendingMetrics} {
		if k, ok := set[name]; ok && k == histogram {
			return name + " is a histogram, no series: select its _bucket, _sum or _count"
		}
	}
	return name + " is not in the metrics contract"
}

// contractIsWellFormed reports the contract entries that break the naming rules of STYLE.md.
func contractIsWellFormed() []string {
	var bad []string
	for _, set := range []map[string]kind{nodeMetrics, sdkMetrics, pendingMetrics} {
		for name, k := range set {
			switch {
			case k == counter && !strings.HasSuffix(name, "_total"):
				bad = append(bad, name+": a counter must end in _total")
			case k != counter && strings.HasSuffix(name, "_total"):
				bad = append(bad, name+": only counters end in _total")
			}
		}
	}
	return bad
}
