package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Sign returns the webhook-signature header value for one delivery, per
// the Standard Webhooks specification: "v1," and the base64 HMAC-SHA256,
// keyed with the secret's base64-decoded bytes (after "whsec_"), of
// "<webhook-id>.<webhook-timestamp>.<body>".
func Sign(secret, id string, ts time.Time, body []byte) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil {
		return "", errors.New("webhook: secret is not whsec_<base64>")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + strconv.FormatInt(ts.Unix(), 10) + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}

// Verify checks a delivery as a receiver would: one of the space-separated
// signatures in sigHeader must match, and the timestamp must be within
// tolerance of now (replay protection).
func Verify(secret, id, tsHeader, sigHeader string, body []byte, now time.Time, tolerance time.Duration) error {
	sec, err := strconv.ParseInt(tsHeader, 10, 64)
	if err != nil {
		return errors.New("webhook: bad webhook-timestamp")
	}
	ts := time.Unix(sec, 0)
	if d := now.Sub(ts); d > tolerance || d < -tolerance {
		return errors.New("webhook: timestamp outside the tolerance")
	}
	want, err := Sign(secret, id, ts, body)
	if err != nil {
		return err
	}
	for _, s := range strings.Fields(sigHeader) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return errors.New("webhook: no signature matches")
}
