//go:build !faultinject

package main

import "net/http"

// registerFaults serves no fault hooks in a normal build (see fault.go, built with -tags faultinject).
func registerFaults(*http.ServeMux, leaderKnower) {}
