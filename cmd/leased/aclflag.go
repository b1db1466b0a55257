package main

import (
	"fmt"
	"os"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
)

// aclFileFlag is --initial-acl-file: the YAML rules a new cluster starts with (api/acl). The file is read
// and validated when the flag is parsed, so a bad file is a usage error before anything starts. An empty
// file name leaves the rules unset.
type aclFileFlag struct {
	path  string
	rules *[]*leasepb.AclRule
}

func (f *aclFileFlag) String() string {
	if f == nil {
		return ""
	}
	return f.path
}

func (f *aclFileFlag) Set(path string) error {
	f.path = path
	if path == "" {
		*f.rules = nil
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	rules, err := acl.Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if rules == nil {
		rules = []*leasepb.AclRule{} // "rules: []" sets an empty ACL, which is not the same as none
	}
	*f.rules = rules
	return nil
}
