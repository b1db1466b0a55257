package server

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// ParseGossipKey reads a --gossip-key-file's content: the base64 encoding of a 16, 24 or 32 byte key
// (AES-128, -192 or -256), as `head -c 32 /dev/urandom | base64` writes it.
func ParseGossipKey(text []byte) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(text)))
	if err != nil {
		return nil, fmt.Errorf("gossip key is not base64: %w", err)
	}
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("gossip key is %d bytes; it must be 16, 24 or 32 (base64 of `head -c 32 /dev/urandom`)", len(key))
}
