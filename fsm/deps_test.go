package fsm

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// allowedImports is everything the state machine may use. Anything that could read a clock, draw a random
// number, do I/O, start goroutines or log is absent on purpose: determinism is the FSM's contract.
var allowedImports = map[string]bool{
	"bytes": true, "encoding/binary": true, "errors": true, "fmt": true, "hash/crc32": true, "strconv": true,
	"slices": true, "strings": true, "cmp": true, "math/bits": true, "unicode/utf8": true,
	// sync/atomic: the count of live views (view.go), released from the goroutine that encoded one. It
	// decides whether a changed lease is copied first, never a result (TestPropertyViewsStayFrozen).
	"sync/atomic":                      true,
	"github.com/google/btree":          true,
	"google.golang.org/protobuf/proto": true,
	// protowire: the protobuf wire format's primitives (the streamed snapshot, snapshot_stream.go).
	"google.golang.org/protobuf/encoding/protowire": true,
	"github.com/leased/leased/api/leasepb":          true,
	// api/acl: the rule semantics, pure functions (its YAML half parses bytes; nothing reads a file).
	"github.com/leased/leased/api/acl":    true,
	"github.com/leased/leased/api/wirepb": true,
}

func TestFSMImportsOnlyDeterministicPackages(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !allowedImports[path] {
				t.Errorf("%s imports %q: the FSM must stay pure (no clock, randomness, I/O, goroutines or logging)", name, path)
			}
		}
		if strings.Contains(string(src), "go func") {
			t.Errorf("%s starts a goroutine", name)
		}
	}
}
