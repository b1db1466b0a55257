package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// notInFile are the flags a --config-file cannot hold: they say what to read or whether to run at all.
var notInFile = map[string]bool{"config-file": true, "version": true, "help-all": true}

// fileSetting is one key of a --config-file: a flag name, its value as written on the command line, and
// the line it is on.
type fileSetting struct {
	name, value string
	line        int
}

// applyConfigFile sets, from the YAML file at path, every flag that neither the command line nor the
// environment set (docs/operations.md, "Configuration file"). The flag set is the file's schema: every
// key must be a flag's name and its value must parse as that flag's, whether or not something else
// overrides it, so a file is either right or refused as a whole (a usageError naming the file and key).
func applyConfigFile(fs *flag.FlagSet, path string) error {
	settings, err := readConfigFile(path)
	if err != nil {
		return usageError{fmt.Errorf("config file %s: %w", path, err)}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// Check every value on flags of their own first: nothing of the file applies unless all of it is valid,
	// and a value that something else overrides today is still checked.
	var scratch options
	check := newFlagSet(&scratch)
	for _, s := range settings {
		if err := checkSetting(check, s); err != nil {
			return usageError{fmt.Errorf("config file %s: line %d: %w", path, s.line, err)}
		}
	}
	for _, s := range settings {
		if !set[s.name] {
			if err := fs.Set(s.name, s.value); err != nil {
				return usageError{fmt.Errorf("config file %s: line %d: %s: %w", path, s.line, s.name, err)}
			}
		}
	}
	return nil
}

func checkSetting(fs *flag.FlagSet, s fileSetting) error {
	switch {
	case fs.Lookup(s.name) == nil:
		return fmt.Errorf("unknown key %q: the keys are leased's flag names without the dashes (leased --help-all)", s.name)
	case notInFile[s.name]:
		return fmt.Errorf("key %q: --%s is a command-line flag only", s.name, s.name)
	}
	if err := fs.Set(s.name, s.value); err != nil {
		return fmt.Errorf("%s: invalid value %q: %w", s.name, s.value, err)
	}
	return nil
}

// readConfigFile returns the settings of the YAML file at path: one mapping of flag names to single
// values, each key once. An empty file holds none.
func readConfigFile(path string) ([]fileSetting, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	if err := dec.Decode(new(yaml.Node)); !errors.Is(err, io.EOF) {
		return nil, errors.New("want one YAML document, found more")
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: want a mapping of flag names to values (max-leases: 100000)", root.Line)
	}
	var out []fileSetting
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("line %d: a key must be a flag name", k.Line)
		}
		if first, dup := seen[k.Value]; dup {
			return nil, fmt.Errorf("line %d: key %q is already set on line %d", k.Line, k.Value, first)
		}
		seen[k.Value] = k.Line
		if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
			return nil, fmt.Errorf("line %d: %s: want one value, written as on the command line (lists comma-separated)", v.Line, k.Value)
		}
		out = append(out, fileSetting{name: k.Value, value: v.Value, line: k.Line})
	}
	return out, nil
}
