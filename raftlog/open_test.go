package raftlog

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestOpenRefusesAnotherIdentityAndNamesBoth(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	other := Identity{ClusterID: 0xc1, NodeID: 2}
	_, err := Open(dir, other)
	if !errors.Is(err, ErrIdentityMismatch) {
		t.Fatalf("Open with another identity: %v, want ErrIdentityMismatch", err)
	}
	for _, want := range []string{filepath.Join(dir, fileName), testID.String(), other.String()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestOpenWithZeroIdentityAcceptsTheRecordedOne(t *testing.T) {
	dir := t.TempDir()
	if err := mustOpen(t, dir).Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Identity{})
	if err != nil {
		t.Fatalf("Open with zero identity: %v", err)
	}
	_ = s.Close()
}

func TestReadIdentity(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := ReadIdentity(dir); ok || err != nil {
		t.Fatalf("ReadIdentity of an empty dir = %v, %v; want false, nil", ok, err)
	}
	if err := mustOpen(t, dir).Close(); err != nil {
		t.Fatal(err)
	}
	id, ok, err := ReadIdentity(dir)
	if !ok || err != nil || id != testID {
		t.Fatalf("ReadIdentity = %v, %v, %v; want %v, true, nil", id, ok, err, testID)
	}
	if err := os.WriteFile(filepath.Join(dir, fileName), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadIdentity(dir); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadIdentity of a damaged file: %v, want ErrCorrupt", err)
	}
}

// TestOpenRejectsForeignFilesAndLeavesThemAlone checks that files Open did
// not write are reported as ErrCorrupt, naming the file, and not modified.
func TestOpenRejectsForeignFilesAndLeavesThemAlone(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	tests := []struct {
		name  string
		write func(t *testing.T, path string)
	}{
		{"empty file", writeBytes(nil)},
		{"short garbage", writeBytes([]byte("not a database"))},
		{"4 KiB of random bytes", writeBytes(random(4096))},
		{"64 KiB of random bytes", writeBytes(random(64 << 10))},
		{"bbolt file without our buckets", writeBolt(func(tx *bolt.Tx) error {
			_, err := tx.CreateBucket([]byte("other"))
			return err
		})},
		{"bbolt file with an unknown format version", writeBolt(func(tx *bolt.Tx) error {
			if err := initLayout(tx, testID, walFrom{}); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keyFormat, []byte{0, 0, 0, 99})
		})},
		{"bbolt file of format 1, which no released build wrote", writeBolt(func(tx *bolt.Tx) error {
			if err := initLayout(tx, testID, walFrom{}); err != nil {
				return err
			}
			return putFormat(tx.Bucket(bucketMeta), 1)
		})},
		{"template truncated to one page", func(t *testing.T, path string) {
			writeBytes(templateFile(t)[:4096])(t, path)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, fileName)
			tt.write(t, path)
			before, _ := os.ReadFile(path)
			_, err := Open(dir, testID)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open: %v; want ErrCorrupt naming %s", err, path)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Fatal("Open modified the file it rejected")
			}
		})
	}
}

func writeBytes(b []byte) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func writeBolt(fn func(*bolt.Tx) error) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(fn); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSecondOpenFailsWithErrLockedInsteadOfHanging(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, dir)
	if _, err := Open(dir, testID); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	if _, _, err := ReadIdentity(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("ReadIdentity while open: %v, want ErrLocked", err)
	}
}

func TestOpenCreatesDirWithPrivateMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	mustOpen(t, dir)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v, want 0700", fi.Mode().Perm())
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, fileName+".init-*"))
	if len(leftovers) != 0 {
		t.Fatalf("temporary files left behind: %v", leftovers)
	}
}

func TestNewerFormatIsAClearError(t *testing.T) {
	dir := t.TempDir()
	writeBolt(func(tx *bolt.Tx) error {
		if err := initLayout(tx, testID, walFrom{}); err != nil {
			return err
		}
		return putFormat(tx.Bucket(bucketMeta), formatVersion+1)
	})(t, filepath.Join(dir, fileName))
	_, err := Open(dir, testID)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "newer than this build knows") {
		t.Fatalf("Open of a format %d file: %v", formatVersion+1, err)
	}
}
