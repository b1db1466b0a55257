// Package fileutil holds the file-system steps durability needs, shared by the WAL, the server and the
// tools. It imports nothing of ours.
package fileutil

import "os"

// SyncDir makes the entries of dir durable: a file created in it, renamed into it or removed from it is
// on disk only once the directory itself is synced, whatever was synced of the file. The error, from
// the os package, names dir.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
