package sqlfence_test

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/leased/leased/client/fence/sqlfence"
)

func TestNewValidatesOptions(t *testing.T) {
	if _, err := sqlfence.New(nil, sqlfence.Dialect{}); err == nil {
		t.Errorf("New with the zero Dialect succeeded")
	}
	for _, parts := range [][]string{nil, {""}, {"a", "b", "c"}, {"s", ""}} {
		if _, err := sqlfence.New(nil, sqlfence.SQLite, sqlfence.WithTable(parts...)); err == nil {
			t.Errorf("WithTable(%q) accepted", parts)
		}
	}
	if _, err := sqlfence.New(nil, sqlfence.PostgreSQL, sqlfence.WithTxOptions(sql.TxOptions{ReadOnly: true})); err == nil {
		t.Errorf("WithTxOptions(ReadOnly) accepted")
	}
}

// TestTableNamesAreQuoted checks that a table name is used exactly as given,
// in each dialect's identifier quoting.
func TestTableNamesAreQuoted(t *testing.T) {
	for _, c := range []struct {
		dialect sqlfence.Dialect
		parts   []string
		want    string
	}{
		{sqlfence.PostgreSQL, []string{"app", `we"ird`}, `"app"."we""ird"`},
		{sqlfence.SQLite, []string{`t"`}, `"t"""`},
		{sqlfence.MariaDB, []string{"app", "we`ird"}, "`app`.`we``ird`"},
		{sqlfence.MariaDB, nil, "`" + sqlfence.DefaultTable + "`"},
	} {
		var opts []sqlfence.Option
		if c.parts != nil {
			opts = append(opts, sqlfence.WithTable(c.parts...))
		}
		f, err := sqlfence.New(nil, c.dialect, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Table(); got != c.want {
			t.Errorf("%s: Table() = %s, want %s", c.dialect, got, c.want)
		}
		if want := "CREATE TABLE IF NOT EXISTS " + c.want + " ("; !strings.HasPrefix(f.Schema(), want) {
			t.Errorf("%s: Schema() = %q, want prefix %q", c.dialect, f.Schema(), want)
		}
	}
}
