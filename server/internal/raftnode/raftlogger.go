package raftnode

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"go.etcd.io/raft/v3"
)

// raftLogger adapts slog to raft's Logger interface. raft is chatty at Info (every election step), so its
// Info goes to Debug unless it is about leadership; warnings and errors keep their level.
type raftLogger struct{ log *slog.Logger }

// NewRaftLogger adapts l to raft's Logger, under component=raft.
func NewRaftLogger(l *slog.Logger) raft.Logger { return &raftLogger{log: l.With("component", "raft")} }

func (r *raftLogger) emit(level slog.Level, msg string) { r.log.Log(context.Background(), level, msg) }

func (r *raftLogger) Debug(v ...any) { r.emit(slog.LevelDebug, fmt.Sprint(v...)) }
func (r *raftLogger) Debugf(format string, v ...any) {
	r.emit(slog.LevelDebug, fmt.Sprintf(format, v...))
}
func (r *raftLogger) Info(v ...any) { r.emit(slog.LevelDebug, fmt.Sprint(v...)) }
func (r *raftLogger) Infof(format string, v ...any) {
	r.emit(slog.LevelDebug, fmt.Sprintf(format, v...))
}
func (r *raftLogger) Warning(v ...any) { r.emit(slog.LevelWarn, fmt.Sprint(v...)) }
func (r *raftLogger) Warningf(format string, v ...any) {
	r.emit(slog.LevelWarn, fmt.Sprintf(format, v...))
}
func (r *raftLogger) Error(v ...any) { r.emit(slog.LevelError, fmt.Sprint(v...)) }
func (r *raftLogger) Errorf(format string, v ...any) {
	r.emit(slog.LevelError, fmt.Sprintf(format, v...))
}

// Fatal and Panic mean raft found its invariants broken; like raft's default logger, stop the process.
func (r *raftLogger) Fatal(v ...any) { r.emit(slog.LevelError, fmt.Sprint(v...)); os.Exit(1) }
func (r *raftLogger) Fatalf(format string, v ...any) {
	r.emit(slog.LevelError, fmt.Sprintf(format, v...))
	os.Exit(1)
}
func (r *raftLogger) Panic(v ...any) { s := fmt.Sprint(v...); r.emit(slog.LevelError, s); panic(s) }
func (r *raftLogger) Panicf(format string, v ...any) {
	s := fmt.Sprintf(format, v...)
	r.emit(slog.LevelError, s)
	panic(s)
}
