package server

import (
	"time"

	"github.com/leased/leased/server/restore"
)

// The offline restore lives in package restore; these names keep programs written against package server
// building.

// DefaultTokenFloorBump is restore.DefaultTokenFloorBump.
const DefaultTokenFloorBump = restore.DefaultTokenFloorBump

// MaxTokenFloor is restore.MaxTokenFloor.
const MaxTokenFloor = restore.MaxTokenFloor

// RestoreConfig is restore.Config.
type RestoreConfig = restore.Config

// RestoreInfo is restore.Info.
type RestoreInfo = restore.Info

// ErrDataDirNotEmpty and ErrClockBehind are restore's.
var (
	ErrDataDirNotEmpty = restore.ErrDataDirNotEmpty
	ErrClockBehind     = restore.ErrClockBehind
)

// DefaultTokenFloor is restore.DefaultTokenFloor.
func DefaultTokenFloor(now time.Time) uint64 { return restore.DefaultTokenFloor(now) }

// RestoreDataDir is restore.DataDir.
func RestoreDataDir(cfg RestoreConfig) (RestoreInfo, error) { return restore.DataDir(cfg) }
