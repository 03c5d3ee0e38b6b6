package queue

import (
	"strconv"

	"github.com/nats-io/nuid"
)

func nuidNext() string { return nuid.Next() }

func itoa(n int) string { return strconv.Itoa(n) }
