// Package servicetest decides, in one place, what an adapter test does when
// the external service it needs (PostgreSQL, Redis) is not configured: skip
// loudly on a developer machine, fail under CI.
package servicetest

import (
	"os"
	"testing"
)

// Require returns the value of the environment variable envVar, which
// locates service for the tests. When it is unset the test is skipped with a
// loud message saying how to get the service, except when CI=true, where a
// missing service fails the test: CI must never pass by skipping.
func Require(t testing.TB, envVar, service string) string {
	t.Helper()
	if v := os.Getenv(envVar); v != "" {
		return v
	}
	msg := "\n" +
		"************************************************************************\n" +
		"*** " + service + " IS NOT AVAILABLE: " + envVar + " is not set.\n" +
		"*** These tests need a real " + service + ". Run them through\n" +
		"***     make test\n" +
		"*** or  scripts/services.sh go test -race ./client/fence/...\n" +
		"*** which start a throwaway " + service + " and set " + envVar + ".\n" +
		"************************************************************************"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "\n*** CI=true: a missing service is a failure, not a skip.")
	}
	t.Skip(msg + "\n*** SKIPPING.")
	return ""
}
