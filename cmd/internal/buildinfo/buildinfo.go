// Package buildinfo says which build of leased a binary is, the same way in every build path.
//
// The version comes from the Go toolchain's build information (runtime/debug.ReadBuildInfo): `go install
// github.com/leased/leased/cmd/leased@v1.2.3` records v1.2.3, and `go build` in a git checkout (make
// build, the Dockerfile, the tests) records the tag of the commit, or a pseudo-version naming it, with
// +dirty for uncommitted changes. A build without either (a source tarball, -buildvcs=false) may set it
// with -ldflags "-X github.com/leased/leased/cmd/internal/buildinfo.version=v1.2.3", which wins.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version is set with -ldflags -X; empty means "ask the build information".
var version string

// Info describes one build.
type Info struct {
	// Version is the module version ("devel" when nothing recorded one).
	Version string `json:"version"`
	// Revision is the VCS commit the binary was built from ("unknown" when not recorded), with
	// Modified set when the work tree had uncommitted changes.
	Revision  string `json:"revision"`
	Modified  bool   `json:"modified"`
	GoVersion string `json:"go_version"`
}

// Read returns this binary's build information.
func Read() Info {
	info := Info{Version: "devel", Revision: "unknown", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			info.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if version != "" {
		info.Version = version
	}
	return info
}

// String is the one-line form both binaries print after their name: "v1.2.3 (revision 0123abc, go1.26.0)".
func (i Info) String() string {
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if i.Modified {
		rev += "+modified"
	}
	return i.Version + " (revision " + rev + ", " + i.GoVersion + ")"
}
