// Package redisfence is a fence adapter for Redis, over go-redis v9.
//
// A fenced write is one Lua script (EVALSHA, falling back to EVAL when the
// server does not have it cached). Redis runs a script atomically, so the
// script checks the token against the resource's fence key, records the
// token, and runs the caller's commands with nothing else interleaved. The
// commands are a small typed list (Set, Del, HSet, HDel, RPush, LPush, SAdd,
// SRem) rather than arbitrary code.
//
// # All or nothing without rollback
//
// Redis does not roll back a script that fails halfway: writes made before a
// failing command stay. The adapter therefore makes every failure happen
// before the first write:
//   - commands are validated in Go before the script is sent: only the
//     allowlisted commands, with their exact key and argument counts, and
//     no key under the fence key prefix;
//   - the allowlist holds only commands that cannot fail on a key of the
//     right type (no INCR, which fails on a non-integer, no options that can
//     be malformed);
//   - the script checks the type of every key before writing, simulating the
//     type each command leaves behind (a DEL then an HSET of the same key
//     passes; an RPUSH then an HSET of it is rejected with ErrWrongType);
//   - the script's first write is the token itself, and Redis refuses a
//     script for lack of memory (maxmemory) only at its first write.
//
// # Keys
//
// The token of resource R lives at the string key prefix+R (DefaultKeyPrefix
// unless WithKeyPrefix says otherwise), as a decimal number. Do not write to
// it yourself.
//
// # Redis Cluster
//
// On Redis Cluster every key of one write, the fence key included, must
// hash to the same slot, or the write fails as a whole with CROSSSLOT. Use
// WithHashTag: the fence key becomes prefix+"{"+R+"}", whose hash tag is the
// resource name, and name the data keys of R with Tag(R) in them
// (Tag("order-42")+":state" is "{order-42}:state"), so that they hash to the
// slot of R's fence key. The resource name itself carries no braces (the
// leased server refuses them in names, and WithHashTag refuses them in
// Write). WithHashTag changes where tokens are stored: switching an existing
// deployment to it starts every resource from no token, so do it only
// while no old holder can still write. Do not use a *redis.Ring, which
// spreads keys without the slot check.
//
// # Caveats
//
// The fence is as durable as Redis is: a Redis without persistence forgets
// tokens when it restarts (along with the data), and with asynchronous
// replication a failover can lose the latest token together with the write
// it guarded, after which an older token could be accepted again. Run Redis
// with AOF persistence (appendfsync always for the strictest setting) and
// consider WAIT after writes if I5 must survive failovers.
package redisfence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/leased/leased/client/fence"
)

// DefaultKeyPrefix is the prefix of the keys holding the fencing tokens.
const DefaultKeyPrefix = "leased:fence:"

// MaxCommandItems bounds the keys plus arguments of one command, so that the
// script cannot run into Lua's stack limit in the middle of its writes.
const MaxCommandItems = 1024

var (
	// ErrInvalidCommand reports a command that is not allowlisted or has the
	// wrong number of keys or arguments. Nothing was written.
	ErrInvalidCommand = errors.New("invalid fenced command")

	// ErrWrongType reports a command whose key holds a value of another type
	// (an HSET of a list). Nothing was written.
	ErrWrongType = errors.New("fenced command on a key of the wrong type")
)

//go:embed script.lua
var scriptSource string

var script = redis.NewScript(scriptSource)

// Client is what a Fence needs of a Redis client. *redis.Client and
// *redis.ClusterClient implement it.
type Client interface {
	redis.Scripter
	Get(ctx context.Context, key string) *redis.StringCmd
}

// Fence performs fenced writes on one Redis deployment. It is safe for
// concurrent use.
type Fence struct {
	rdb     Client
	prefix  string
	hashTag bool
}

// Option configures a Fence.
type Option func(*Fence)

// WithKeyPrefix keeps the tokens under keys starting with prefix instead of
// DefaultKeyPrefix. Fenced commands may not touch keys under the prefix, so
// it should be one that no data key starts with. With an empty prefix the
// token key is the resource name itself.
func WithKeyPrefix(prefix string) Option {
	return func(f *Fence) { f.prefix = prefix }
}

// WithHashTag stores the token of resource R at prefix+"{"+R+"}", so that
// on Redis Cluster it hashes to the slot of every key that contains Tag(R).
// Write then refuses resource names containing '{' or '}' (which would
// change the hash tag), and a prefix containing them is refused too.
func WithHashTag() Option {
	return func(f *Fence) { f.hashTag = true }
}

// New returns a Fence over rdb.
func New(rdb Client, opts ...Option) *Fence {
	f := &Fence{rdb: rdb, prefix: DefaultKeyPrefix}
	for _, opt := range opts {
		opt(f)
	}
	return f
}

// Tag returns the Redis Cluster hash tag of resource, "{"+resource+"}":
// with WithHashTag, every key that contains it (and no '{' before it)
// hashes to the slot of the resource's fence key.
func Tag(resource string) string { return "{" + resource + "}" }

// Key returns the key holding the token of resource.
func (f *Fence) Key(resource string) string {
	if f.hashTag {
		return f.prefix + Tag(resource)
	}
	return f.prefix + resource
}

// checkResource validates resource, and with WithHashTag the key layout:
// braces in the resource or the prefix would move the hash tag.
func (f *Fence) checkResource(resource string) error {
	if err := fence.ValidateResource(resource); err != nil {
		return err
	}
	switch {
	case !f.hashTag:
		return nil
	case strings.ContainsAny(resource, "{}"):
		return fmt.Errorf("%w: %q contains '{' or '}', which would change its Redis Cluster hash tag",
			fence.ErrInvalidResource, resource)
	case strings.ContainsAny(f.prefix, "{}"):
		return fmt.Errorf("redisfence: key prefix %q contains '{' or '}', which WithHashTag does not allow", f.prefix)
	}
	return nil
}

// Write performs a fenced write: in one script it checks token against the
// highest token recorded for resource, records it, and runs cmds in order.
// If token is stale it returns a *fence.StaleTokenError and runs nothing.
// Commands are validated first (ErrInvalidCommand) and key types checked
// before any write (ErrWrongType); either failure writes nothing. With no
// commands, Write only records the token.
func (f *Fence) Write(ctx context.Context, resource string, token uint64, cmds ...Command) error {
	if err := f.checkResource(resource); err != nil {
		return err
	}
	if err := fence.ValidateToken(token); err != nil {
		return err
	}
	keys, args, err := f.encode(resource, token, cmds)
	if err != nil {
		return err
	}
	reply, err := script.Run(ctx, f.rdb, keys, args...).Slice()
	if err != nil {
		return scriptError(err)
	}
	return decodeReply(resource, token, reply)
}

// Claim records token as the highest token of resource without writing any
// data (Write with no commands): a token lower than one already accepted is
// refused with a *fence.StaleTokenError; an equal one is accepted. A new
// holder claims its token before its first write so that an older holder's
// late write is refused from then on.
func (f *Fence) Claim(ctx context.Context, resource string, token uint64) error {
	return f.Write(ctx, resource, token)
}

// Highest returns the highest token accepted for resource, or 0 if none.
func (f *Fence) Highest(ctx context.Context, resource string) (uint64, error) {
	if err := f.checkResource(resource); err != nil {
		return 0, err
	}
	v, err := f.rdb.Get(ctx, f.Key(resource)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read token of %q: %w", resource, err)
	}
	token, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read token of %q: corrupt value %q", resource, v)
	}
	return token, nil
}

// encode validates cmds and lays them out as the script expects.
func (f *Fence) encode(resource string, token uint64, cmds []Command) (keys []string, args []any, err error) {
	keys = []string{f.Key(resource)}
	args = []any{strconv.FormatUint(token, 10), len(cmds)}
	for i, c := range cmds {
		name, err := f.validate(c, keys[0])
		if err != nil {
			return nil, nil, fmt.Errorf("command %d: %w", i, err)
		}
		keys = append(keys, c.Keys...)
		args = append(args, name, len(c.Keys), len(c.Args))
		args = append(args, c.Args...)
	}
	return keys, args, nil
}

func scriptError(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "LEASEDFENCE WRONGTYPE"):
		return fmt.Errorf("%w: %s", ErrWrongType, msg)
	case strings.Contains(msg, "LEASEDFENCE unsupported"):
		return fmt.Errorf("%w: %s", ErrInvalidCommand, msg)
	}
	return fmt.Errorf("run fence script: %w", err)
}

func decodeReply(resource string, token uint64, reply []any) error {
	if len(reply) >= 1 && reply[0] == int64(1) {
		return nil
	}
	if len(reply) == 2 && reply[0] == int64(0) {
		if s, ok := reply[1].(string); ok {
			if highest, err := strconv.ParseUint(s, 10, 64); err == nil {
				return fence.Stale(resource, token, highest)
			}
		}
	}
	return fmt.Errorf("run fence script: unexpected reply %v", reply)
}
