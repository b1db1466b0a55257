package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	dashboardPath  = "../../deploy/grafana/leased.json"
	alertsPath     = "../../deploy/prometheus/alerts.yaml"
	alertsTestPath = "../../deploy/prometheus/alerts_test.yaml"
	operationsPath = "../../docs/operations.md"
	runbookPrefix  = "https://github.com/leased/leased/blob/main/docs/operations.md#"
)

// --- the dashboard

type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int                       `json:"id"`
	Type       string                    `json:"type"`
	Title      string                    `json:"title"`
	Datasource *datasource               `json:"datasource"`
	Targets    []panelTarget             `json:"targets"`
	Panels     []panel                   `json:"panels"` // a collapsed row's
	GridPos    *struct{ H, W, X, Y int } `json:"gridPos"`
}

type panelTarget struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": "..."} in newer Grafana
	Datasource *datasource     `json:"datasource"`
}

// query returns the variable's query string, in either of Grafana's spellings.
func (v variable) query() (string, error) {
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		return "", fmt.Errorf("variable %s: query is neither a string nor {\"query\": ...}: %v", v.Name, err)
	}
	return o.Query, nil
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(raw) {
		t.Fatalf("%s is not valid JSON", dashboardPath)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels returns the dashboard's panels with the rows' own (collapsed rows hold theirs inside).
func allPanels(d dashboard) []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// The prometheus data source is the ${datasource} variable, never a fixed uid, so the dashboard imports
// into any Grafana.
func isOurDatasource(ds *datasource) bool {
	return ds != nil && ds.Type == "prometheus" && (ds.UID == "${datasource}" || ds.UID == "$datasource")
}

func TestDashboardIsWellFormed(t *testing.T) {
	d := loadDashboard(t)
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want 36 or later", d.SchemaVersion)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both", d.UID, d.Title)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("want a variable datasource of type datasource over prometheus, got %+v", v)
	}
	if v, ok := vars["instance"]; !ok || v.Type != "query" || !isOurDatasource(v.Datasource) {
		t.Errorf("want a query variable instance on ${datasource}, got %+v", v)
	}
	ids := map[int]string{}
	n := 0
	for _, p := range allPanels(d) {
		if prev, ok := ids[p.ID]; ok || p.ID == 0 {
			t.Errorf("panel %q: id %d is zero or also %q's", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if p.GridPos == nil {
			t.Errorf("panel %q has no gridPos", p.Title)
		}
		if p.Type == "row" {
			continue
		}
		n++
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if !isOurDatasource(p.Datasource) {
			t.Errorf("panel %q: datasource %+v, want the prometheus ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %s has no expr", p.Title, tg.RefID)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q is empty or repeated", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource != nil && !isOurDatasource(tg.Datasource) {
				t.Errorf("panel %q target %s: datasource %+v, want the prometheus ${datasource}", p.Title, tg.RefID, tg.Datasource)
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d panels besides rows", n)
	}
}

// dashboardQueries returns every PromQL expression of the dashboard, described by where it is.
func dashboardQueries(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range allPanels(d) {
		for _, tg := range p.Targets {
			out[fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)] = tg.Expr
		}
	}
	labelValues := regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := v.query()
		if err != nil {
			t.Error(err)
			continue
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(<selector>, <label>)", v.Name, q)
			continue
		}
		out["variable "+v.Name] = m[1]
	}
	return out
}

func TestDashboardUsesOnlyContractMetrics(t *testing.T) {
	known := seriesNames(nodeMetrics, sdkMetrics, prometheusMetrics)
	shown := map[string]bool{}
	queries := dashboardQueries(t, loadDashboard(t))
	for where, expr := range queries {
		names, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: %q names no metric", where, expr)
		}
		for _, name := range names {
			metric, ok := known[name]
			if !ok {
				t.Errorf("%s: %s (expr %q)", where, unknown(name), expr)
				continue
			}
			if strings.HasPrefix(where, "panel ") {
				shown[metric] = true
			}
		}
	}
	// The other way round: every series a node exports has a panel.
	for name := range nodeMetrics {
		if !shown[name] {
			t.Errorf("no panel shows %s", name)
		}
	}
}

// --- the alerts

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadAlerts(t *testing.T) ruleFile {
	t.Helper()
	raw, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true) // a misspelt key (anotations:) fails here instead of being dropped
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	return f
}

func TestAlertsUseOnlyContractMetrics(t *testing.T) {
	known := seriesNames(nodeMetrics, sdkMetrics, pendingMetrics, prometheusMetrics)
	f := loadAlerts(t)
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			n++
			names, err := metricNames(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
				continue
			}
			if len(names) == 0 {
				t.Errorf("%s: %q names no metric", r.Alert, r.Expr)
			}
			for _, name := range names {
				if _, ok := known[name]; !ok {
					t.Errorf("%s: %s (expr %q)", r.Alert, unknown(name), r.Expr)
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s has no rules", alertsPath)
	}
}

// Every alert has a severity, a summary, a description and a runbook: a section of docs/operations.md
// headed with the alert's name, which the runbook_url points to.
func TestAlertsHaveRunbooks(t *testing.T) {
	f := loadAlerts(t)
	if len(f.Groups) != 1 || f.Groups[0].Name != "leased" {
		t.Fatalf("want one group named leased, got %d groups", len(f.Groups))
	}
	ops, err := os.ReadFile(operationsPath)
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(ops), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			headings[strings.TrimSpace(h)] = true
		}
	}
	var names []string
	for _, r := range f.Groups[0].Rules {
		if r.Alert == "" {
			t.Errorf("rule %q is not an alert (recording rules belong elsewhere)", r.Expr)
			continue
		}
		if slices.Contains(names, r.Alert) {
			t.Errorf("alert %s is defined twice", r.Alert)
		}
		names = append(names, r.Alert)
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		if want := runbookPrefix + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if !headings[r.Alert] {
			t.Errorf("%s: %s has no section \"### %s\" (its runbook)", r.Alert, filepath.Base(operationsPath), r.Alert)
		}
	}
	for _, want := range []string{"LeasedNodeDown", "LeasedNoLeader", "LeasedFrequentLeaderChanges", "LeasedSlowFsync",
		"LeasedExpiryLag", "LeasedQuotaNearlyFull", "LeasedPeerUnreachable"} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s", want)
		}
	}
}

// Every alert has a promtool unit test in which it fires and one in which it stays quiet.
func TestEveryAlertIsUnitTested(t *testing.T) {
	raw, err := os.ReadFile(alertsTestPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", alertsTestPath, err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, g := range loadAlerts(t).Groups {
		for _, r := range g.Rules {
			if !fires[r.Alert] {
				t.Errorf("%s: no test in %s where it fires", r.Alert, filepath.Base(alertsTestPath))
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no test in %s where it stays quiet", r.Alert, filepath.Base(alertsTestPath))
			}
		}
	}
}

func TestContractNamesFollowTheStyle(t *testing.T) {
	for _, bad := range contractIsWellFormed() {
		t.Error(bad)
	}
}
