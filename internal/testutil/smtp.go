package testutil

import "github.com/emersion/go-smtp"

// Send runs one mail transaction on c (MAIL, a RCPT per address, DATA) and
// returns the error of the first step that failed, as the server answered
// it (an *smtp.SMTPError where it replied with a code).
func Send(c *smtp.Client, from string, to []string, body []byte) error {
	if err := c.Mail(from, nil); err != nil {
		return err
	}
	for _, r := range to {
		if err := c.Rcpt(r, nil); err != nil {
			return err
		}
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write(body); err != nil {
		return err
	}
	return w.Close()
}
