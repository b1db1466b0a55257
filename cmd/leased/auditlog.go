package main

import (
	"fmt"
	"log/slog"
	"os"
)

// openAuditLog is the destination --audit-log names (docs/operations.md, "Audit trail"): nil for stderr
// (the server writes the trail to the node's log), a logger that discards everything for off, or a
// logger appending to the file, in the log's format and at its level. The returned func closes the file.
func openAuditLog(o options) (*slog.Logger, func(), error) {
	switch o.auditLog {
	case "stderr":
		return nil, func() {}, nil
	case "off":
		return slog.New(slog.DiscardHandler), func() {}, nil
	case "":
		return nil, nil, usageError{fmt.Errorf("--audit-log: want stderr, off or a file path")}
	}
	f, err := os.OpenFile(o.auditLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("--audit-log: %w", err)
	}
	return newLogger(o, f), func() { _ = f.Close() }, nil
}
