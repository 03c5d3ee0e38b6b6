// Command outflow is the one binary of the outflow mail sender: the daemon
// (serve), the submission client (submit), the reply classifier (classify),
// the retry calculator (schedule), the admin verbs (queue, dest, suppress,
// webhook, apikey) and helpers (passwd, version).
//
// Each subcommand lives in its own file and registers itself on rootCmd from
// an init function, so adding a verb never touches this file.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

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
	markUsageErrors(rootCmd)
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "outflow:", err)
		os.Exit(exitCode(err))
	}
}

var markOnce sync.Once

// markUsageErrors makes the command line's own errors usage errors (exit
// 2): a wrong number of arguments, an unknown or malformed flag, an
// unknown subcommand. cobra reports them as plain errors, which would exit
// 1 like a failure of the operation.
func markUsageErrors(root *cobra.Command) {
	markOnce.Do(func() {
		root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
		// `help TOPIC` for a topic that is not a command: cobra prints
		// "Unknown help topic" and exits 0.
		root.InitDefaultHelpCmd()
		for _, c := range root.Commands() {
			if c.Name() != "help" || c.Run == nil {
				continue
			}
			show := c.Run
			c.Run, c.RunE = nil, func(cmd *cobra.Command, args []string) error {
				if target, rest, err := root.Find(args); target == nil || err != nil || len(rest) > 0 {
					return usageError{fmt.Errorf("unknown help topic %q", strings.Join(args, " "))}
				}
				show(cmd, args)
				return nil
			}
		}
		var walk func(c *cobra.Command)
		walk = func(c *cobra.Command) {
			switch {
			case c.Args != nil:
				args := c.Args
				c.Args = func(cmd *cobra.Command, a []string) error {
					if err := args(cmd, a); err != nil {
						return usageError{err}
					}
					return nil
				}
			case c.HasParent() && c.HasSubCommands() && c.Run == nil && c.RunE == nil:
				// A group (queue, dest ...) runs nothing itself: alone
				// it shows its help, and any argument is an unknown
				// subcommand. (The root's own unknown commands are
				// cobra's, with its suggestions and `help` topics;
				// exitCode maps them.)
				c.Args = cobra.ArbitraryArgs
				c.RunE = func(cmd *cobra.Command, a []string) error {
					if len(a) == 0 {
						return cmd.Help()
					}
					msg := fmt.Sprintf("unknown command %q for %q", a[0], cmd.CommandPath())
					if cmd.SuggestionsMinimumDistance <= 0 {
						cmd.SuggestionsMinimumDistance = 2 // cobra's own default
					}
					if s := cmd.SuggestionsFor(a[0]); len(s) > 0 {
						msg += "; did you mean " + strings.Join(s, " or ") + "?"
					}
					return usageError{errors.New(msg)}
				}
			}
			for _, sub := range c.Commands() {
				walk(sub)
			}
		}
		walk(root)
	})
}

// exitCode maps an error to a process exit status: 2 for usage errors (the
// command line's, and those a command finds in its flags' values), 1 for
// everything else.
func exitCode(err error) int {
	var u usageError
	if asUsage(err, &u) || strings.HasPrefix(err.Error(), "unknown command ") {
		return 2
	}
	return 1
}
