package fence

import (
	"errors"
	"fmt"
	"math"
)

// MaxToken is the largest valid token. Tokens are Raft log indexes, which
// never come near it; the bound lets adapters store a token as a signed
// 64-bit integer (SQL BIGINT) without overflow.
const MaxToken uint64 = math.MaxInt64

// Sentinel errors. Adapters wrap them; match them with errors.Is.
var (
	// ErrStaleToken reports a write rejected because its token is lower than
	// the highest token already accepted for the resource. The error
	// returned is a *StaleTokenError, which carries the details.
	ErrStaleToken = errors.New("stale fencing token")

	// ErrInvalidToken reports a token outside [1, MaxToken]. Token 0 is
	// invalid because Raft log indexes, and so grant tokens, start at 1.
	ErrInvalidToken = errors.New("invalid fencing token")

	// ErrInvalidResource reports an empty resource name.
	ErrInvalidResource = errors.New("invalid resource name")
)

// StaleTokenError is returned when a fenced write is rejected because its
// token is lower than the highest token accepted for the resource. Nothing
// was written. It matches ErrStaleToken with errors.Is.
type StaleTokenError struct {
	// Resource is the resource the write was for.
	Resource string
	// Token is the rejected token.
	Token uint64
	// Highest is the highest token the store had accepted for the resource
	// when it rejected the write; it is greater than Token.
	Highest uint64
}

// Error implements error.
func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("stale fencing token for %q: token %d < highest accepted %d",
		e.Resource, e.Token, e.Highest)
}

// Is reports whether target is ErrStaleToken, so that
// errors.Is(err, ErrStaleToken) holds for a (wrapped) *StaleTokenError.
func (e *StaleTokenError) Is(target error) bool {
	return target == ErrStaleToken
}

// Stale returns the error an adapter reports when token is rejected because
// highest has been accepted for resource.
func Stale(resource string, token, highest uint64) error {
	return &StaleTokenError{Resource: resource, Token: token, Highest: highest}
}

// Check applies the comparison at the heart of the contract: it returns nil
// if token may be accepted for resource whose highest accepted token is
// highest (0 for none), and a *StaleTokenError otherwise. Equal tokens pass.
// Adapters call it inside their atomic step.
func Check(resource string, token, highest uint64) error {
	if token < highest {
		return Stale(resource, token, highest)
	}
	return nil
}

// Validate checks a resource name and a token before a fenced write. It
// returns an error wrapping ErrInvalidResource or ErrInvalidToken.
func Validate(resource string, token uint64) error {
	if err := ValidateResource(resource); err != nil {
		return err
	}
	return ValidateToken(token)
}

// ValidateResource returns an error wrapping ErrInvalidResource if resource
// is empty.
func ValidateResource(resource string) error {
	if resource == "" {
		return fmt.Errorf("%w: empty", ErrInvalidResource)
	}
	return nil
}

// ValidateToken returns an error wrapping ErrInvalidToken if token is 0 (Raft
// log indexes start at 1, so no grant carries it) or above MaxToken.
func ValidateToken(token uint64) error {
	switch {
	case token == 0:
		return fmt.Errorf("%w: 0 (tokens start at 1)", ErrInvalidToken)
	case token > MaxToken:
		return fmt.Errorf("%w: %d exceeds %d", ErrInvalidToken, token, MaxToken)
	}
	return nil
}
