// Command outflow is the one binary of the outflow mail sender: the daemon
// (serve), the submission client (submit), the reply classifier (classify),
// the retry calculator (schedule), the admin verbs (queue, dest, suppress,
// webhook, apikey) and helpers (passwd, version).
//
// Each subcommand lives in its own file and registers itself on rootCmd from
// an init function, so adding a verb never touches this file.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

var rootCmd = &cobra.Command{
	Use:           "outflow",
	Short:         "outbound email sender with coordinated throttling",
	SilenceUsage:  true,
	SilenceErrors: true,
}

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "outflow", version)
		},
	})
}

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "outflow:", err)
		os.Exit(exitCode(err))
	}
}

// exitCode maps an error to a process exit status: 2 for usage errors that
// cobra reports, 1 for everything else.
func exitCode(err error) int {
	var u usageError
	if ok := asUsage(err, &u); ok {
		return 2
	}
	return 1
}
