package fsm

import "github.com/leased/leased/api/wirepb"

// Per-identity lease counts (decision 14: with authentication, limits per identity). A holder label is
// chosen by the client, so with client authentication two identities may use the same one; counting the
// per-holder limit across identities would let one use up another's allowance. identities counts each
// identity's live leases, in all and per holder label, so that an Acquire can be refused at its
// identity's limit (AcquireCmd.identity_limit) and at its holder label's limit within the identity
// (holder_limit_per_identity). Leases without an identity are not counted here. The counts are derived
// from the leases (kept by insert and remove, rebuilt by a restore), never stored in a snapshot.

// identityUse is one identity's live leases: how many in all, and how many under each holder label.
type identityUse struct {
	leases  int
	holders map[string]int
}

// countIdentity keeps the identity counts in step with a lease that was inserted (delta 1) or removed (-1).
func (f *FSM) countIdentity(l *lease, delta int) {
	if l.identity == "" {
		return
	}
	u := f.identities[l.identity]
	if u == nil {
		u = &identityUse{holders: make(map[string]int, 1)}
		f.identities[l.identity] = u
	}
	u.leases += delta
	if n := u.holders[l.holder.name] + delta; n > 0 {
		u.holders[l.holder.name] = n
	} else {
		delete(u.holders, l.holder.name)
	}
	if u.leases == 0 {
		delete(f.identities, l.identity)
	}
}

// IdentityCount is the number of live leases that belong to identity.
func (f *FSM) IdentityCount(identity string) int {
	if u, ok := f.identities[identity]; ok {
		return u.leases
	}
	return 0
}

// overLimit reports which of the command's limits a new grant would pass: HolderLimit, IdentityLimit, or
// OK when neither. The holder's count is the holder label's leases of every identity, or, with
// holder_limit_per_identity, only those of the command's identity.
func (f *FSM) overLimit(c *wirepb.AcquireCmd) Code {
	u := f.identities[c.Identity]
	if c.HolderLimit > 0 {
		held := 0
		switch {
		case c.HolderLimitPerIdentity && c.Identity != "":
			if u != nil {
				held = u.holders[c.Holder]
			}
		default:
			if h := f.holders[c.Holder]; h != nil {
				held = len(h.leases)
			}
		}
		if held >= int(c.HolderLimit) {
			return HolderLimit
		}
	}
	if c.IdentityLimit > 0 && c.Identity != "" && u != nil && u.leases >= int(c.IdentityLimit) {
		return IdentityLimit
	}
	return OK
}
