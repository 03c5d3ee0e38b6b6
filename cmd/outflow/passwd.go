package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/outflow/outflow/submission"
)

// maxPasswordLine bounds what passwd reads from stdin; bcrypt uses at most
// 72 bytes, so anything near this is a mistake (a file piped by accident).
const maxPasswordLine = 1024

func init() {
	var (
		user string
		cost int
	)
	cmd := &cobra.Command{
		Use:   "passwd",
		Short: "read a password on stdin and print its bcrypt hash for the users file (read by serve at start)",
		Long: `passwd reads one password from stdin (the first line, without its line
ending) and prints its bcrypt hash. With --user NAME it prints a whole users
file line, NAME:HASH. The password is never echoed back or written anywhere;
typed at a terminal, it is read without echo.

  outflow passwd --user app < password.txt >> data/users`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if user != "" {
				if err := submission.ValidateUserName(user); err != nil {
					return usageError{fmt.Errorf("--user: %w", err)}
				}
			}
			pw, err := readPassword(cmd.InOrStdin(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			hash, err := submission.HashPassword(pw, cost)
			if err != nil {
				return err
			}
			if user != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "%s:%s\n", user, hash)
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), hash)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "print a users file line NAME:HASH instead of the hash alone")
	cmd.Flags().IntVar(&cost, "cost", 10, "bcrypt cost, 4..31; each step doubles the work (10 is about 50 ms)")
	rootCmd.AddCommand(cmd)
}

// readPassword reads the password from in: typed at a terminal, after a
// prompt on prompt and with the terminal's echo off; else the first line
// of what is piped in.
func readPassword(in io.Reader, prompt io.Writer) (string, error) {
	f, ok := in.(*os.File)
	if !ok {
		return readPasswordLine(in)
	}
	restore, ok := echoOff(f)
	if !ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			// A terminal whose echo cannot be turned off here: say
			// what is expected, and that typing will echo.
			fmt.Fprint(prompt, "Password (will echo; pipe it in to avoid that): ")
		}
		return readPasswordLine(in)
	}
	// Interrupted, the process ends without its deferred calls: the echo
	// is put back first, or the shell's terminal would stay without it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		if _, ok := <-sig; ok {
			restore()
			fmt.Fprintln(prompt)
			os.Exit(130)
		}
	}()
	defer func() {
		signal.Stop(sig)
		close(sig)
		restore()
		fmt.Fprintln(prompt) // the Enter typed was not echoed either
	}()
	fmt.Fprint(prompt, "Password: ")
	return readPasswordLine(f)
}

// readPasswordLine returns the first line of r without its "\n" or "\r\n".
func readPasswordLine(r io.Reader) (string, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, maxPasswordLine+1), maxPasswordLine+1)
	line, err := br.ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read password: %w", err)
	}
	if len(line) > maxPasswordLine {
		return "", fmt.Errorf("read password: first line longer than %d bytes", maxPasswordLine)
	}
	line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if line == "" {
		return "", errors.New("read password: empty password on stdin")
	}
	return line, nil
}
