package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// promqlFunctions are PromQL's functions: an identifier followed by "(" must be one of these (or an
// aggregation), so a typo in a function name fails instead of passing as a metric name.
var promqlFunctions = set(
	"abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time",
	"ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "day_of_month",
	"day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv", "double_exponential_smoothing",
	"end", "exp", "floor", "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile",
	"histogram_stddev", "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase",
	"info", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2", "mad_over_time",
	"max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear", "present_over_time",
	"quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort",
	"sort_by_label", "sort_by_label_desc", "sort_desc", "sqrt", "start", "stddev_over_time",
	"stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year",
)

// promqlAggregations may be followed by "by (...)" or "without (...)" before their "(".
var promqlAggregations = set(
	"avg", "bottomk", "count", "count_values", "group", "limit_ratio", "limitk", "max", "min", "quantile",
	"stddev", "stdvar", "sum", "topk",
)

// promqlGroupings are followed by a parenthesised list of label names (optional for group_left/right).
var promqlGroupings = set("by", "without", "on", "ignoring", "group_left", "group_right")

// promqlKeywords are the remaining words that are not metric names.
var promqlKeywords = set("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan")

func set(words ...string) map[string]bool {
	m := map[string]bool{}
	for _, w := range words {
		m[w] = true
	}
	return m
}

type tokKind int

const (
	tokIdent tokKind = iota
	tokOpen          // (
	tokClose         // )
	tokOther         // anything else that matters for structure: numbers, operators, commas, {...}
)

type token struct {
	kind tokKind
	text string
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

func isIdentPart(c byte) bool { return isIdentStart(c) || ('0' <= c && c <= '9') }

// skipString returns the index just past the string literal that starts at s[i] (", ' or `).
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at offset %d", i)
}

// skipTo returns the index just past the closer byte that ends the block opened at s[i], skipping strings.
func skipTo(s string, i int, closer byte) (int, error) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '"', '\'', '`':
			end, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case closer:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unclosed %q at offset %d", s[i], i)
}

// lex splits a PromQL expression into the tokens that decide which words are metric names. It drops what
// can hold no metric name: string literals, comments, label matchers ({...}: label names and values),
// ranges and subquery steps ([...]), Grafana variables ($instance, ${instance}, $__rate_interval) and
// numbers (a duration such as 5m after offset lexes as a number).
func lex(s string) ([]token, error) {
	var toks []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{tokOther, s[i:end]})
			i = end
		case c == '{' || c == '[':
			closer := byte('}')
			if c == '[' {
				closer = ']'
			}
			end, err := skipTo(s, i, closer)
			if err != nil {
				return nil, err
			}
			if c == '{' && strings.Contains(s[i:end], "__name__") {
				return nil, fmt.Errorf("selects by __name__ at offset %d: write the metric name", i)
			}
			toks = append(toks, token{tokOther, s[i:end]})
			i = end
		case c == '$':
			j := i + 1
			if j < len(s) && s[j] == '{' {
				end, err := skipTo(s, j, '}')
				if err != nil {
					return nil, err
				}
				j = end
			} else {
				for j < len(s) && isIdentPart(s[j]) {
					j++
				}
			}
			toks = append(toks, token{tokOther, s[i:j]})
			i = j
		case '0' <= c && c <= '9' || (c == '.' && i+1 < len(s) && '0' <= s[i+1] && s[i+1] <= '9'):
			j := i + 1
			for j < len(s) && (isIdentPart(s[j]) || s[j] == '.' ||
				((s[j] == '+' || s[j] == '-') && (s[j-1] == 'e' || s[j-1] == 'E'))) {
				j++
			}
			toks = append(toks, token{tokOther, s[i:j]})
			i = j
		case isIdentStart(c):
			j := i + 1
			for j < len(s) && isIdentPart(s[j]) {
				j++
			}
			toks = append(toks, token{tokIdent, s[i:j]})
			i = j
		case c == '(':
			toks = append(toks, token{tokOpen, "("})
			i++
		case c == ')':
			toks = append(toks, token{tokClose, ")"})
			i++
		default:
			toks = append(toks, token{tokOther, string(c)})
			i++
		}
	}
	return toks, nil
}

// metricNames returns the metric names a PromQL expression selects, sorted, without repeats: every
// identifier that is not a function, an aggregation, a keyword or a label name in a grouping list. An
// unknown function is an error.
func metricNames(expr string) ([]string, error) {
	toks, err := lex(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t.kind != tokIdent {
			continue
		}
		word := strings.ToLower(t.text)
		calls := i+1 < len(toks) && toks[i+1].kind == tokOpen
		switch {
		case promqlGroupings[word]:
			if calls { // skip the label list
				j := i + 2
				for j < len(toks) && toks[j].kind != tokClose {
					if toks[j].kind == tokOpen {
						return nil, fmt.Errorf("%q: nested parenthesis in the label list of %s", expr, t.text)
					}
					j++
				}
				if j == len(toks) {
					return nil, fmt.Errorf("%q: unclosed label list of %s", expr, t.text)
				}
				i = j
			} else if word == "by" || word == "without" || word == "on" || word == "ignoring" {
				return nil, fmt.Errorf("%q: %s without a label list", expr, t.text)
			}
		case promqlAggregations[word], promqlKeywords[word]:
		case calls:
			if !promqlFunctions[t.text] {
				return nil, fmt.Errorf("%q: unknown function %s", expr, t.text)
			}
		default:
			names = append(names, t.text)
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up{job="leased"} == 0`, []string{"up"}},
		{`(leased_has_leader == 0) and on (job, instance) (up{job="leased"} == 1)`,
			[]string{"leased_has_leader", "up"}},
		{`histogram_quantile(0.99, sum by (job, instance, le) (rate(leased_disk_fsync_duration_seconds_bucket[5m]))) > 0.1`,
			[]string{"leased_disk_fsync_duration_seconds_bucket"}},
		{`sum without (le) (rate(a_total{x=~"b|c", y!="rate(d)"}[$__rate_interval])) / ignoring(k) group_left b_count`,
			[]string{"a_total", "b_count"}},
		{`label_replace(m1{instance=~"$instance"}, "dst", "$1", "src", "(.*)") * on(instance) group_left(version) m2`,
			[]string{"m1", "m2"}},
		{`max_over_time(m1[${__range}:1m] offset 5m) + 1e-3 + 0x1F + .5 + Inf`, []string{"m1"}},
		{"# a comment naming not_a_metric\nsum(m1) by (instance) # and another_one", []string{"m1"}},
		{`increase(m1[15m]) > bool 3 unless m1 or m1`, []string{"m1"}},
		{`count(m1)`, []string{"m1"}},
		{`vector(1)`, nil},
	} {
		got, err := metricNames(tc.expr)
		if err != nil {
			t.Errorf("metricNames(%q): %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{
		`rat(m1[5m])`,          // a typo in a function
		`{__name__="m1"}`,      // a name we cannot check
		`sum by instance (m1)`, // no label list
		`m1{job="x"`,           // unclosed matcher
		`m1{job="x}`,           // unterminated string
		`sum by (instance (m1)`,
	} {
		if got, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q) = %q, want an error", bad, got)
		}
	}
}
