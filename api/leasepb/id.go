package leasepb

import (
	"fmt"
	"strconv"
)

// This file is hand-written (not generated): the one spelling of raft node and cluster ids.

// FormatID spells a raft node or cluster id the one way leased prints it everywhere (logs, /readyz,
// leasectl tables and JSON): 16 lower-case hex digits, zero-padded, e.g. "00000000000000a3". Ids are
// hashes that use all 64 bits, so JSON carries them as this string, never as a number (2^53 and up lose
// digits in JavaScript and jq).
func FormatID(id uint64) string { return fmt.Sprintf("%016x", id) }

// ParseID reads an id spelled in hex, as FormatID writes it; leading zeros may be left out and upper-case
// digits are accepted ("a3", "00000000000000A3").
func ParseID(s string) (uint64, error) {
	if s == "" || len(s) > 16 {
		return 0, fmt.Errorf("invalid id %q: want up to 16 hex digits", s)
	}
	for _, r := range s {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f' || 'A' <= r && r <= 'F') {
			return 0, fmt.Errorf("invalid id %q: want up to 16 hex digits", s)
		}
	}
	id, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid id %q: %w", s, err)
	}
	return id, nil
}
