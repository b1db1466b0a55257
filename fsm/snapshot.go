package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// Snapshot envelope: magic (8 bytes) | version (uint32, big endian) | body length (uint64, big endian) |
// CRC-32C of the body (uint32, big endian) | body (a deterministic wirepb.SnapshotBody).
const (
	snapshotMagic   = "LEASEDSN"
	snapshotVersion = 1
	headerSize      = len(snapshotMagic) + 4 + 8 + 4
)

// ErrBadSnapshot: Restore was given bytes that are not a valid snapshot of this format.
var ErrBadSnapshot = errors.New("fsm: bad snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot encodes the whole state. Equal states encode to equal bytes. It is View().Encode(), so it
// needs the access View needs.
func (f *FSM) Snapshot() ([]byte, error) {
	v := f.View()
	defer v.Release()
	return v.Encode()
}

// Restore decodes a snapshot into a new FSM. It checks the envelope and checksum and every record's
// consistency; on any fault it returns an error wrapping ErrBadSnapshot and no FSM.
func Restore(data []byte) (*FSM, error) {
	payload, err := openEnvelope(data)
	if err != nil {
		return nil, err
	}
	body, leases, err := decodeBody(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: decode body: %v", ErrBadSnapshot, err)
	}
	return fromBody(body, leases)
}

func openEnvelope(data []byte) ([]byte, error) {
	if len(data) < headerSize {
		return nil, fmt.Errorf("%w: %d bytes is shorter than the %d-byte header", ErrBadSnapshot, len(data), headerSize)
	}
	if !bytes.Equal(data[:8], []byte(snapshotMagic)) {
		return nil, fmt.Errorf("%w: not a leased snapshot (magic %q)", ErrBadSnapshot, data[:8])
	}
	if v := binary.BigEndian.Uint32(data[8:]); v != snapshotVersion {
		return nil, fmt.Errorf("%w: unsupported version %d (this build reads %d)", ErrBadSnapshot, v, snapshotVersion)
	}
	payload := data[headerSize:]
	if n := binary.BigEndian.Uint64(data[12:]); n != uint64(len(payload)) {
		return nil, fmt.Errorf("%w: body is %d bytes, header says %d (truncated?)", ErrBadSnapshot, len(payload), n)
	}
	if sum := crc32.Checksum(payload, castagnoli); sum != binary.BigEndian.Uint32(data[20:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrBadSnapshot)
	}
	return payload, nil
}

// fromBody builds an FSM from a decoded body and its encoded lease records (decodeBody), rejecting
// anything a correct FSM could not have produced.
func fromBody(body *wirepb.SnapshotBody, leases leaseRecords) (*FSM, error) {
	f := New()
	f.applied, f.highest = body.AppliedIndex, body.HighestToken
	f.clusterID, f.generation = body.ClusterId, body.Generation
	if f.highest > f.applied {
		return nil, fmt.Errorf("%w: highest token %d beyond applied index %d", ErrBadSnapshot, f.highest, f.applied)
	}
	if err := f.restoreLeases(leases); err != nil {
		return nil, err
	}
	prevDelay := ""
	for i, d := range body.LockDelays {
		if err := checkDelay(d, prevDelay, i, f); err != nil {
			return nil, err
		}
		prevDelay = d.Resource
		f.delays[d.Resource] = lockDelay{token: d.Token, index: d.Index, delayMs: d.DelayMs}
	}
	if err := f.restoreEnds(body); err != nil {
		return nil, err
	}
	if body.Acl != nil {
		if err := acl.Validate(body.Acl.GetRules()); err != nil {
			return nil, fmt.Errorf("%w: acl: %v", ErrBadSnapshot, err)
		}
		f.acl, f.aclSet = cloneRules(body.Acl.GetRules()), true
	}
	if err := f.restoreMembers(body.Members, body.RemovedMembers); err != nil {
		return nil, err
	}
	if err := f.restoreAnswered(body.AnsweredRequests); err != nil {
		return nil, err
	}
	return f, nil
}

var endEventType = [...]leasepb.EventType{
	EndReleased:  leasepb.EventType_EVENT_TYPE_RELEASED,
	EndExpired:   leasepb.EventType_EVENT_TYPE_EXPIRED,
	EndForgotten: leasepb.EventType_EVENT_TYPE_UNSPECIFIED, // never stored
}

// restoreEnds rebuilds the remembered ends. A snapshot with more ends than this binary keeps (a larger
// MaxRememberedEnds before) keeps its newest ones.
func (f *FSM) restoreEnds(body *wirepb.SnapshotBody) error {
	if body.ForgottenThrough == nil {
		return fmt.Errorf("%w: no forgotten_through", ErrBadSnapshot)
	}
	f.ends.forgottenThrough = body.GetForgottenThrough()
	if f.ends.forgottenThrough > f.applied {
		return fmt.Errorf("%w: forgotten_through %d beyond applied index %d", ErrBadSnapshot, f.ends.forgottenThrough, f.applied)
	}
	prev := f.ends.forgottenThrough // ends of one Expire entry share an index, some may be evicted
	for i, r := range body.Ends {
		var how EndKind
		switch r.GetHow() {
		case leasepb.EventType_EVENT_TYPE_RELEASED:
			how = EndReleased
		case leasepb.EventType_EVENT_TYPE_EXPIRED:
			how = EndExpired
		default:
			return fmt.Errorf("%w: lease end %d has kind %v", ErrBadSnapshot, i, r.GetHow())
		}
		switch {
		case r.Resource == "" || r.Token == 0 || r.Token > f.highest:
			return fmt.Errorf("%w: lease end %d names no valid grant", ErrBadSnapshot, i)
		case r.Index < r.Token || r.Index > f.applied || r.Index < prev:
			return fmt.Errorf("%w: lease end %d (%q token %d) has index %d out of order", ErrBadSnapshot, i, r.Resource, r.Token, r.Index)
		case f.IsCurrent(r.Resource, r.Token):
			return fmt.Errorf("%w: %q token %d both current and ended", ErrBadSnapshot, r.Resource, r.Token)
		}
		if _, dup := f.ends.byToken[r.Token]; dup {
			return fmt.Errorf("%w: token %d ended twice", ErrBadSnapshot, r.Token)
		}
		prev = r.Index
		f.ends.add(r.Resource, r.Token, r.Index, how)
	}
	return nil
}

// restoreLeases decodes, checks and places the lease records one at a time, into two records that take
// turns, so that each is checked against the one before it (the first against an empty record, which
// every resource follows); then it indexes their request ids, all at once.
func (f *FSM) restoreLeases(leases leaseRecords) error {
	var recs [2]record
	prev := &record{}
	withID := 0
	err := leases.each(func(i int, data []byte) error {
		r := &recs[i%2]
		if err := decodeRecord(data, r); err != nil {
			return fmt.Errorf("%w: decode lease %d: %v", ErrBadSnapshot, i, err)
		}
		if err := checkRecord(r, prev, i, f.highest); err != nil {
			return err
		}
		if err := f.checkSlot(r, prev); err != nil {
			return err
		}
		prev = r
		l := f.leaseFromRecord(r)
		f.place(l)
		if l.requestID != "" {
			withID++
		}
		return nil
	})
	if err != nil {
		return err
	}
	f.indexRequests(withID)
	return nil
}

func checkRecord(r, prev *record, i int, highest uint64) error {
	switch {
	case r.resource == "" || len(r.holder) == 0:
		return fmt.Errorf("%w: lease %d has an empty resource or holder", ErrBadSnapshot, i)
	case r.resource < prev.resource || (r.resource == prev.resource && (r.limit == 0 || r.token <= prev.token)):
		return fmt.Errorf("%w: lease %d (%q) out of order or duplicated", ErrBadSnapshot, i, r.resource)
	case r.token == 0 || r.token > highest:
		return fmt.Errorf("%w: lease %q has token %d outside 1..%d", ErrBadSnapshot, r.resource, r.token, highest)
	case r.ttlMs <= 0 || r.lockDelayMs < 0 || r.remainingMs < 0:
		return fmt.Errorf("%w: lease %q has a negative duration", ErrBadSnapshot, r.resource)
	}
	return nil
}

func checkDelay(d *wirepb.LockDelayRecord, prev string, i int, f *FSM) error {
	switch {
	case d.Resource == "" || d.Resource <= prev:
		return fmt.Errorf("%w: lock-delay %d out of order, duplicated or unnamed", ErrBadSnapshot, i)
	case d.Token == 0 || d.Token > f.highest || d.Index > f.applied || d.DelayMs <= 0:
		return fmt.Errorf("%w: lock-delay on %q is inconsistent", ErrBadSnapshot, d.Resource)
	}
	if _, held := f.Get(d.Resource); held {
		return fmt.Errorf("%w: %q is both leased and in its lock-delay", ErrBadSnapshot, d.Resource)
	}
	return nil
}

func (f *FSM) leaseFromRecord(r *record) *lease {
	h := f.holders[string(r.holder)]
	if h == nil {
		h = newHolder(string(r.holder))
		f.holders[h.name] = h
	}
	l := &lease{
		resource:    r.resource,
		holder:      h,
		token:       r.token,
		ttlMs:       durationMs(r.ttlMs),
		lockDelayMs: durationMs(r.lockDelayMs),
		remainingMs: r.remainingMs,
		value:       string(r.value),
		requestID:   r.requestID,
		identity:    h.sharedIdentityBytes(r.identity),
		limit:       r.limit,
		epoch:       f.epoch,
	}
	l.set(flagCheckpointed, r.checkpointed)
	l.set(flagRenewed, r.renewed)
	l.set(flagProclaimed, r.proclaimed)
	return l
}

// sortedKeys returns m's keys in order, so map iteration order never leaks into results.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
