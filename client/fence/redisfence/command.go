package redisfence

import (
	"fmt"
	"strings"
)

// Command is one Redis command run inside a fenced write. Build it with the
// constructors (Set, Del, HSet, ...) or by hand: Name is one of the
// allowlisted commands (case does not matter), Keys its key arguments and
// Args the rest, in order. Args are encoded by go-redis (strings, []byte,
// numbers, bools, encoding.BinaryMarshaler).
type Command struct {
	Name string
	Keys []string
	Args []any
}

// arity is the shape an allowlisted command must have.
type arity struct {
	keys    int  // exact number of keys; 0 means one or more
	minArgs int  // minimum number of args
	maxArgs int  // maximum number of args; -1 means no maximum
	pairs   bool // args come in pairs
}

// allowed lists the commands a fenced write may run: those that cannot fail
// on a key of the right type once their shape is checked. The script keeps
// the matching list of key types.
var allowed = map[string]arity{
	"SET":   {keys: 1, minArgs: 1, maxArgs: 1},
	"DEL":   {keys: 0, minArgs: 0, maxArgs: 0},
	"HSET":  {keys: 1, minArgs: 2, maxArgs: -1, pairs: true},
	"HDEL":  {keys: 1, minArgs: 1, maxArgs: -1},
	"RPUSH": {keys: 1, minArgs: 1, maxArgs: -1},
	"LPUSH": {keys: 1, minArgs: 1, maxArgs: -1},
	"SADD":  {keys: 1, minArgs: 1, maxArgs: -1},
	"SREM":  {keys: 1, minArgs: 1, maxArgs: -1},
}

// Set sets key to value (SET key value, without options).
func Set(key string, value any) Command {
	return Command{Name: "SET", Keys: []string{key}, Args: []any{value}}
}

// Del deletes keys.
func Del(keys ...string) Command { return Command{Name: "DEL", Keys: keys} }

// HSet sets fields of the hash at key; fieldValues alternate field, value.
func HSet(key string, fieldValues ...any) Command {
	return Command{Name: "HSET", Keys: []string{key}, Args: fieldValues}
}

// HDel deletes fields of the hash at key.
func HDel(key string, fields ...string) Command {
	return Command{Name: "HDEL", Keys: []string{key}, Args: anys(fields)}
}

// RPush appends values to the list at key.
func RPush(key string, values ...any) Command {
	return Command{Name: "RPUSH", Keys: []string{key}, Args: values}
}

// LPush prepends values to the list at key.
func LPush(key string, values ...any) Command {
	return Command{Name: "LPUSH", Keys: []string{key}, Args: values}
}

// SAdd adds members to the set at key.
func SAdd(key string, members ...any) Command {
	return Command{Name: "SADD", Keys: []string{key}, Args: members}
}

// SRem removes members from the set at key.
func SRem(key string, members ...any) Command {
	return Command{Name: "SREM", Keys: []string{key}, Args: members}
}

func anys(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// validate checks c against the allowlist and returns its canonical name.
// The fence key and keys under the fence prefix are refused: a fenced
// command must not be able to overwrite or delete a token.
func (f *Fence) validate(c Command, fenceKey string) (string, error) {
	name := strings.ToUpper(c.Name)
	a, ok := allowed[name]
	if !ok {
		return "", fmt.Errorf("%w: %q is not allowlisted", ErrInvalidCommand, c.Name)
	}
	if err := a.check(name, len(c.Keys), len(c.Args)); err != nil {
		return "", err
	}
	for _, k := range c.Keys {
		if k == fenceKey || f.prefix != "" && strings.HasPrefix(k, f.prefix) {
			return "", fmt.Errorf("%w: %s of key %q under the fence key prefix", ErrInvalidCommand, name, k)
		}
	}
	return name, nil
}

func (a arity) check(name string, keys, args int) error {
	switch {
	case a.keys == 0 && keys == 0, a.keys > 0 && keys != a.keys:
		return fmt.Errorf("%w: %s with %d keys", ErrInvalidCommand, name, keys)
	case args < a.minArgs, a.maxArgs >= 0 && args > a.maxArgs, a.pairs && args%2 != 0:
		return fmt.Errorf("%w: %s with %d arguments", ErrInvalidCommand, name, args)
	case keys+args > MaxCommandItems:
		return fmt.Errorf("%w: %s with %d keys and arguments, more than %d",
			ErrInvalidCommand, name, keys+args, MaxCommandItems)
	}
	return nil
}
