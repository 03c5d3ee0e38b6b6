package worker

import (
	"os"
	"strconv"
)

func defaultWorkerID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "outflow"
	}
	return h + "-" + strconv.Itoa(os.Getpid())
}
