package chaos

import (
	"strings"
	"testing"

	"github.com/leased/leased/client"
)

func TestAuditCheckerFindsAMissingLine(t *testing.T) {
	logs := `time=2026-12-01T08:00:00Z level=INFO msg="lease granted" node=n1 event=granted resource=hot/0/1 token=5 holder=w1 index=5 role=leader
time=2026-12-01T08:00:01Z level=INFO msg="lease released" node=n2 event=released resource=hot/0/1 token=5 holder=w1 index=9 role=follower
time=2026-12-01T08:00:02Z level=INFO msg="became leader" node=n1 term=3
`
	audited := map[auditKey]bool{}
	if err := readAudit(strings.NewReader(logs), audited); err != nil {
		t.Fatal(err)
	}
	events := []event{
		{Type: client.Granted, Index: 5, Resource: "hot/0/1", Token: 5},
		{Type: client.Released, Index: 9, Resource: "hot/0/1", Token: 5},
	}
	if v := checkAudit(events, audited); len(v) != 0 {
		t.Fatalf("every event has its line: %v", v)
	}
	events = append(events, event{Type: client.Expired, Index: 12, Resource: "cold/0/2", Token: 11})
	if v := checkAudit(events, audited); len(v) != 1 || !strings.Contains(v[0], "index 12") {
		t.Fatalf("a lost audit line: %v", v)
	}
}

func TestLeaderGaugesChecker(t *testing.T) {
	node := func(has, is, changes string) string {
		return "# HELP x\nleased_has_leader " + has + "\nleased_is_leader " + is + "\nleased_leader_changes_total " + changes + "\n"
	}
	if v := checkLeaderGauges([]string{node("1", "1", "3"), node("1", "0", "2"), node("1", "0", "2")}, 4); len(v) != 0 {
		t.Fatalf("a healthy cluster: %v", v)
	}
	for name, xs := range map[string][]string{
		"two leaders":           {node("1", "1", "3"), node("1", "1", "2"), node("1", "0", "2")},
		"no leader known":       {node("1", "1", "3"), node("0", "0", "2"), node("1", "0", "2")},
		"changes never counted": {node("1", "1", "0"), node("1", "0", "0"), node("1", "0", "0")},
		"a series missing":      {node("1", "1", "3"), "leased_is_leader 0\n", node("1", "0", "2")},
	} {
		if v := checkLeaderGauges(xs, 4); len(v) == 0 {
			t.Errorf("%s: not caught", name)
		}
	}
}
