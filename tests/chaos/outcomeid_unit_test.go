package chaos

import (
	"fmt"
	"strings"
	"testing"

	"github.com/leased/leased/client"
)

// TestOutcomeIDChecker: an Acquire error that leaves the outcome unknown without naming the request id
// is a finding; other errors are not the checker's business.
func TestOutcomeIDChecker(t *testing.T) {
	r := &run{}
	r.checkOutcomeID("r", "id1", fmt.Errorf("acquire: %w", client.ErrHeld))
	r.checkOutcomeID("r", "id1", nil)
	if len(r.outcomeFindings) != 0 {
		t.Fatalf("findings for errors that are not unknown outcomes: %v", r.outcomeFindings)
	}
	r.checkOutcomeID("r", "id1", fmt.Errorf("acquire: %w", client.ErrOutcomeUnknown))
	if len(r.outcomeFindings) != 1 || !strings.Contains(r.outcomeFindings[0], `"id1"`) {
		t.Fatalf("an unknown outcome naming no request id: findings %v", r.outcomeFindings)
	}
}
