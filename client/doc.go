// Package client is the Go SDK for leased: leases that keep themselves alive and say the moment they can
// no longer be trusted, leader election on top of them, and the reads and watches that tools need.
//
// # Basics
//
//	c, err := client.New(client.Config{Endpoints: []string{"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"}})
//	lease, err := c.Acquire(ctx, "db/primary", client.WithTTL(10*time.Second))
//	err = store.Claim(ctx, "db/primary", lease.Token()) // before the first write: older holders are refused from now on
//	err = lease.Fenced(ctx, func(ctx context.Context, token uint64) error {
//		return store.Write(ctx, "db/primary", token, ...) // a client/fence adapter checks the token
//	})
//	<-lease.Done() // closed once the lease can no longer be trusted; lease.Err() says why
//
// The client follows the leader named in every answer and goes straight to it. Calls that find no leader
// (Unavailable) are retried on other nodes with full-jitter exponential backoff, under a retry budget shared
// by the whole client, until the call's context ends. Every call takes a context.
//
// # What it promises
//
//   - Acquire draws one request id per call and reuses it for every retry, so an ambiguous timeout never
//     yields two grants or a spurious "held" (the server returns the same grant for the same id).
//   - One KeepAlive stream per client renews every held lease about every TTL/3. A lease's validity is
//     counted on this machine's clock from when its last successful renewal was *sent*, less a drift margin
//     (Config.ClockDrift × TTL + Config.MinDriftMargin). Done closes when that runs out — before the cluster
//     can re-grant the resource, as long as clock rates differ by less than ClockDrift.
//   - Across a leader change the keeper reconnects and renews again; a lease whose server-side deadline has
//     not passed is not lost. A round of renewals unanswered within half the renewal interval (a frozen
//     node, a black-holed link) abandons its stream and renews through another node at once.
//   - Each attempt of a call gets a share of its deadline (max(RequestTimeout/3, 500ms), or half of what
//     is left of a shorter call) and DialTimeout to connect; nodes that miss it are skipped for a while,
//     and an unknown leader is found by asking every endpoint in parallel. Connections send keepalive
//     pings (Config.PingInterval, PingTimeout).
//
// # Caveats
//
// Done closing is a promise about this process's *knowledge*, not about its actions: a process can pause
// between checking and writing. Writes to shared storage must carry the token and be checked by the storage
// (client/fence). Claim the token at the storage as soon as Acquire returns: until the new holder's token
// reaches the storage, the storage cannot refuse an older holder's late write. Release is best effort; the
// TTL is the real clean-up.
package client
