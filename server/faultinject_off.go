//go:build !faultinject

package server

// diskFaults injects nothing in a normal build (see faultinject.go).
type diskFaults struct{}

func (*diskFaults) beforeWrite(<-chan struct{}, func() string) error { return nil }
