package chaos

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/tests/internal/proc"
)

// ---- the observability promises, held against the cluster ----

// auditLine matches one audit trail line of a node's text log (docs/operations.md, "Audit trail").
var auditLine = regexp.MustCompile(`\bevent=(granted|released|expired) .*\btoken=(\d+) .*\bindex=(\d+)\b`)

// auditKey identifies one lease event: what happened, to which token, at which index.
type auditKey struct {
	event        string
	token, index uint64
}

var eventNames = map[client.EventType]string{client.Granted: "granted", client.Released: "released", client.Expired: "expired"}

// readAudit collects the audit trail lines of the node logs.
func readAudit(r io.Reader, into map[auditKey]bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := auditLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		tok, _ := strconv.ParseUint(m[2], 10, 64)
		idx, _ := strconv.ParseUint(m[3], 10, 64)
		into[auditKey{m[1], tok, idx}] = true
	}
	return sc.Err()
}

// checkAudit: every grant, release and expiry in the applied event stream has its audit line in at
// least one node's trail (the leader writes it, and a new leader first writes the lines of what it
// applied as a follower, so a leader change or a SIGKILLed leader loses none). A missing line is an
// event the audit trail lost.
func checkAudit(events []event, audited map[auditKey]bool) []string {
	var v []string
	for _, e := range events {
		if !audited[auditKey{eventNames[e.Type], e.Token, e.Index}] {
			v = append(v, fmt.Sprintf("obs: %s of %s token %d at index %d has no audit line in any node's log", eventNames[e.Type], e.Resource, e.Token, e.Index))
		}
	}
	return v
}

// gauge reads one unlabelled gauge or counter from a Prometheus text exposition.
func gauge(exposition, name string) (float64, bool) {
	for _, line := range strings.Split(exposition, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// checkLeaderGauges: once healed, every node's /metrics says it has a leader and exactly one says it
// leads; and the leader changes the harness saw are counted.
func checkLeaderGauges(expositions []string, sawLeaderChanges int) []string {
	leaders, changes := 0, 0.0
	for i, x := range expositions {
		has, ok1 := gauge(x, "leased_has_leader")
		is, ok2 := gauge(x, "leased_is_leader")
		c, ok3 := gauge(x, "leased_leader_changes_total")
		if !ok1 || !ok2 || !ok3 {
			return []string{fmt.Sprintf("obs: node %d's /metrics lacks leased_has_leader, leased_is_leader or leased_leader_changes_total", i)}
		}
		if has != 1 {
			return []string{fmt.Sprintf("obs: node %d reports leased_has_leader %v in a healed cluster", i, has)}
		}
		leaders += int(is)
		changes += c
	}
	var v []string
	if leaders != 1 {
		v = append(v, fmt.Sprintf("obs: %d nodes report leased_is_leader 1, want exactly one", leaders))
	}
	if sawLeaderChanges > 0 && changes == 0 {
		v = append(v, fmt.Sprintf("obs: the harness saw %d leader changes, leased_leader_changes_total is 0 everywhere", sawLeaderChanges))
	}
	return v
}

// withAuditLog adds --audit-log <dir>/<name>.audit.log to the command line of every node.
func withAuditLog(next func(int) []string, dir string, name func(int) string) func(int) []string {
	return func(i int) []string {
		var args []string
		if next != nil {
			args = next(i)
		}
		return append(args, "--audit-log="+filepath.Join(dir, name(i)+".audit.log"))
	}
}

// checkObservability runs both checks against the cluster after the run.
func (r *run) checkObservability(events []event) []string {
	audited := map[auditKey]bool{}
	// Every trail file, those of members the membership nemesis replaced included, and the node logs.
	trails, _ := filepath.Glob(filepath.Join(r.dir, "cluster", "*.audit.log"))
	for _, n := range r.c.Nodes {
		trails = append(trails, n.LogPath)
	}
	for _, path := range trails {
		f, err := os.Open(path)
		if err != nil {
			return []string{"obs: " + err.Error()}
		}
		err = readAudit(f, audited)
		_ = f.Close()
		if err != nil {
			return []string{"obs: reading " + path + ": " + err.Error()}
		}
	}
	v := checkAudit(events, audited)
	// The gauges settle a little after the cluster does: poll until they agree, or report what they say.
	var last []string
	_ = proc.Poll(10*time.Second, func() bool {
		var xs []string
		for _, n := range r.c.Nodes {
			x, err := scrape(n.AdminAddr)
			if err != nil {
				last = []string{"obs: scraping " + n.Name + ": " + err.Error()}
				return false
			}
			xs = append(xs, x)
		}
		last = checkLeaderGauges(xs, r.leaderChanges)
		return len(last) == 0
	})
	return append(v, last...)
}

func scrape(addr string) (string, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
