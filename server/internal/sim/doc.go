// Package sim holds the in-memory parts that let whole leased nodes run in one test process with no
// sockets and no disk: a seeded network (Network) that carries raft messages and forwarded requests
// between nodes with drops, delays, reordering, one-way cuts, partitions and isolation, and a raft log
// over raft.MemoryStorage (Storage) whose writes can be stalled.
//
// Every fault decision is drawn from a math/rand/v2 PCG stream per directed link, seeded from the
// network's seed, so a seed fixes which messages of a link are dropped and how long each is delayed.
// What a seed does not fix is the interleaving of goroutines within one instant, so a replay runs the
// same fault schedule, not necessarily the same execution.
//
// Nothing here reads a clock other than through time.Now, time.After and time.Sleep: run inside a
// testing/synctest bubble, delays and stalls take virtual time only.
//
// Caveats: delivery is one goroutine per message (reordering falls out of unequal delays); a message in
// flight when its link is cut is lost at delivery, as on a cut connection. Close waits for every
// delivery goroutine.
package sim
