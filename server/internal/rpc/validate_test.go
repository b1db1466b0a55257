package rpc

import (
	"strings"
	"testing"
)

// allowedInResource is the documented set, [A-Za-z0-9] and "/_-.:@=+", written out independently of
// resourceByte's table.
func allowedInResource(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/_-.:@=+", c) >= 0
}

func TestResourceBytesAreTheDocumentedSet(t *testing.T) {
	for c := range 256 {
		if resourceByte(byte(c)) != allowedInResource(byte(c)) {
			t.Errorf("byte %q: resourceByte says %v", byte(c), resourceByte(byte(c)))
		}
	}
}
