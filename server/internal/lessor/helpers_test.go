package lessor

import (
	"time"
)

// defaultConfig is what server.DefaultConfig gives the lessor: --checkpoint-interval 5s, two election
// timeouts of 10 ticks of 100 ms, --expiry-batch 1000, --expiry-rate 50000.
func defaultConfig() Config {
	return Config{CheckpointInterval: 5 * time.Second, Retry: 2 * time.Second, ExpiryBatch: 1000, ExpiryRate: 50_000}
}

// testConfig is what server.TestConfig gives the lessor: a checkpoint interval of 200 ms and ticks of
// 10 ms (an election timeout of 100 ms).
func testConfig() Config {
	c := defaultConfig()
	c.CheckpointInterval = 200 * time.Millisecond
	c.Retry = 200 * time.Millisecond
	return c
}
