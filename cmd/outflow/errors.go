package main

import "errors"

// usageError marks an error caused by how the command was called, not by
// what it tried to do; main exits 2 for it.
type usageError struct{ error }

func asUsage(err error, target *usageError) bool { return errors.As(err, target) }
