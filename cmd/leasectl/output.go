package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// table collects rows and prints them aligned (text/tabwriter) on flush.
type table struct {
	w *tabwriter.Writer
}

func (a *app) newTable(header ...string) *table {
	t := &table{w: tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		// A tab or newline inside a cell would break the alignment.
		cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(c)
	}
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.w.Flush() }

// emitJSON writes v as one line of JSON on stdout. Safe for concurrent use (stream callbacks).
func (a *app) emitJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	a.outMu.Lock()
	defer a.outMu.Unlock()
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// ms formats a millisecond count as a Go duration ("1.5s").
func ms(n int64) string { return (time.Duration(n) * time.Millisecond).String() }

// dur formats a duration rounded to milliseconds.
func dur(d time.Duration) string { return d.Round(time.Millisecond).String() }

// orDash shows an empty cell as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// bytesHuman formats a byte count for tables.
func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
