package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// list --holder H --prefix P finds every match even when the holder's first page of leases lies outside
// the prefix (the prefix used to be applied after the page was cut, which ended the listing early).
func TestListHolderAndPrefixPagesPastNonMatches(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	eps := c.Endpoints()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := client.New(client.Config{Endpoints: eps, Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// More leases outside the prefix than one page of list (listPageSize), all sorting before the matches.
	for i := range listPageSize + 20 {
		if _, err := cl.Acquire(ctx, fmt.Sprintf("a/%04d", i), client.WithTTL(time.Minute)); err != nil {
			t.Fatalf("acquire: %v", err)
		}
	}
	for i := range 3 {
		if _, err := cl.Acquire(ctx, fmt.Sprintf("b/%d", i), client.WithTTL(time.Minute)); err != nil {
			t.Fatalf("acquire: %v", err)
		}
	}
	r := want(t, ctl(t, eps, "-o", "json", "list", "--holder", "h", "--prefix", "b/"), 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("want the 3 leases under b/, got %v", r)
	}
	for i, l := range lines {
		if info := mustJSON[infoJSON](t, l); info.Resource != fmt.Sprintf("b/%d", i) || info.Holder != "h" {
			t.Fatalf("line %d: %+v", i, info)
		}
	}
}
