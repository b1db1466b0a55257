package leasepb_test

import (
	"math"
	"testing"

	"github.com/leased/leased/api/leasepb"
)

func TestFormatIDIsSixteenLowerCaseHexDigits(t *testing.T) {
	for id, want := range map[uint64]string{
		0:              "0000000000000000",
		0xa3:           "00000000000000a3",
		1<<53 + 1:      "0020000000000001",
		math.MaxUint64: "ffffffffffffffff",
	} {
		if got := leasepb.FormatID(id); got != want {
			t.Errorf("FormatID(%d) = %q, want %q", id, got, want)
		}
		back, err := leasepb.ParseID(want)
		if err != nil || back != id {
			t.Errorf("ParseID(%q) = %d, %v; want %d", want, back, err, id)
		}
	}
}

func TestParseIDAcceptsShortAndUpperCaseHex(t *testing.T) {
	for s, want := range map[string]uint64{"4": 4, "a3": 0xa3, "00000000000000A3": 0xa3, "DEADbeef": 0xdeadbeef} {
		if got, err := leasepb.ParseID(s); err != nil || got != want {
			t.Errorf("ParseID(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
}

func TestParseIDRejectsWhatFormatIDNeverWrites(t *testing.T) {
	for _, s := range []string{"", "0x4", "+4", "-1", " 4", "g", "00000000000000000", "1_0"} {
		if id, err := leasepb.ParseID(s); err == nil {
			t.Errorf("ParseID(%q) = %d, want an error", s, id)
		}
	}
}
