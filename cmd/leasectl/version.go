package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/leased/leased/cmd/internal/buildinfo"
)

// versionCommand prints leasectl's build, as leased --version prints the server's (the same rule:
// buildinfo). The servers' versions are in `leasectl status`.
func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print leasectl's version (the servers' are in 'leasectl status')",
		Long: `version prints leasectl's version, VCS revision and Go version; with -o json one object
{"version","revision","modified","go_version"}. It does not contact the cluster.`,
		Example: `  leasectl version -o json`,
		Args:    noArgs,
		RunE: a.body(func(*cobra.Command, []string) error {
			info := buildinfo.Read()
			if a.jsonOut() {
				return a.emitJSON(info)
			}
			_, err := fmt.Fprintf(a.stdout, "leasectl %s\n", info)
			return err
		}),
	}
}
