package acl

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"

	"github.com/leased/leased/api/leasepb"
)

// The YAML format (docs/security.md, "Identities and ACLs"):
//
//	rules:
//	  - identity: alice        # exact identity, or "*"
//	    prefix: jobs/          # resource prefix; "" is every resource
//	    permissions: [read, lease]
//
// Every key is required in every rule (a missing prefix is an error, not "every resource": a forgotten
// line must not grant everything); unknown keys are errors.

type fileFormat struct {
	Rules []fileRule `yaml:"rules"`
}

type fileRule struct {
	Identity    string   `yaml:"identity"`
	Prefix      *string  `yaml:"prefix"`
	Permissions []string `yaml:"permissions"`
}

// Parse reads a rules file and validates it (Validate). Errors name the rule and the key.
func Parse(data []byte) ([]*leasepb.AclRule, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f fileFormat
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("acl: the file is empty (want a \"rules:\" list; \"rules: []\" for none)")
		}
		return nil, fmt.Errorf("acl: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("acl: the file holds more than one YAML document")
	}
	if f.Rules == nil {
		return nil, errors.New("acl: no \"rules\" key (write \"rules: []\" for none)")
	}
	rules := make([]*leasepb.AclRule, len(f.Rules))
	for i, r := range f.Rules {
		if r.Prefix == nil {
			return nil, fmt.Errorf("acl: rules[%d].prefix: is required (\"\" for every resource)", i)
		}
		rule := &leasepb.AclRule{Identity: r.Identity, Prefix: *r.Prefix}
		for _, name := range r.Permissions {
			p, ok := ParsePermission(name)
			if !ok {
				return nil, fmt.Errorf("acl: rules[%d].permissions: unknown permission %q (want read, lease or admin)", i, name)
			}
			rule.Permissions = append(rule.Permissions, p)
		}
		rules[i] = rule
	}
	if err := Validate(rules); err != nil {
		return nil, fmt.Errorf("acl: %w", err)
	}
	return rules, nil
}

// Marshal writes rules in the format Parse reads.
func Marshal(rules []*leasepb.AclRule) ([]byte, error) {
	f := fileFormat{Rules: make([]fileRule, len(rules))}
	for i, r := range rules {
		prefix := r.GetPrefix()
		f.Rules[i] = fileRule{Identity: r.GetIdentity(), Prefix: &prefix}
		for _, p := range r.GetPermissions() {
			f.Rules[i].Permissions = append(f.Rules[i].Permissions, Name(p))
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, fmt.Errorf("acl: encode: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("acl: encode: %w", err)
	}
	return buf.Bytes(), nil
}
