// Package mailhdr reads what outflow needs from a message's header
// section as it was submitted, without refusing what a mail system
// accepts: the fields present, their unfolded values, and the addresses
// of an address field whatever charset its display names are in.
//
// net/mail and net/textproto are stricter than SMTP submission: textproto
// refuses a header with a raw control byte (an unencoded ISO-2022-JP
// Subject), and net/mail decodes display names only in UTF-8, ISO-8859-1
// and US-ASCII, so a From with a windows-1252 or ISO-2022-JP name could
// not be read. The submission listener then refused it as not from the
// tenant's sender domains, and the DKIM signer signed under the wrong
// domain or not at all.
package mailhdr

import (
	"bytes"
	"io"
	"mime"
	"net/mail"
	"strings"
)

// Values returns the unfolded values of the fields named name (compared
// without case) in msg's header section, which ends at the first empty
// line.
func Values(msg []byte, name string) []string {
	var out []string
	cur := -1 // index in out of the field being continued, or -1
	for len(msg) > 0 {
		var line []byte
		line, msg = Line(msg)
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			if cur >= 0 {
				out[cur] += " " + strings.TrimSpace(string(line))
			}
			continue
		}
		cur = -1
		n, v, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimRight(n, " \t"), []byte(name)) {
			out = append(out, strings.TrimSpace(string(v)))
			cur = len(out) - 1
		}
	}
	return out
}

// Names counts the fields in msg's header section by lower-cased name.
func Names(msg []byte) map[string]int {
	out := map[string]int{}
	for len(msg) > 0 {
		var line []byte
		line, msg = Line(msg)
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if n, _, ok := bytes.Cut(line, []byte(":")); ok {
			out[strings.ToLower(string(bytes.TrimRight(n, " \t")))]++
		}
	}
	return out
}

// Line splits the first line off msg: the line without its line end, and
// what follows it.
func Line(msg []byte) (line, rest []byte) {
	line = msg
	if i := bytes.IndexByte(msg, '\n'); i >= 0 {
		line, rest = msg[:i+1], msg[i+1:]
	}
	return bytes.TrimRight(line, "\r\n"), rest
}

// parser reads address lists with encoded words in any charset: the
// display names' bytes are passed through undecoded (outflow needs the
// addresses, not the names).
var parser = mail.AddressParser{WordDecoder: &mime.WordDecoder{
	CharsetReader: func(_ string, input io.Reader) (io.Reader, error) { return input, nil },
}}

// Addresses parses v, the value of an address field such as From. A
// value net/mail cannot parse for its display names (raw 8-bit or
// escape-sequence bytes, not encoded words) gives the addresses in its
// angle brackets, when it has some and every one of them parses, and
// nothing outside them has an "@"; otherwise the parser's error. So
// `ceo@bank.example; <a@shop.example>` is an error, not a@shop.example
// alone: a reader's mail program may show the address the brackets do
// not hold, and the sender-domains check and the DKIM signer must read
// every address a reader could be shown.
func Addresses(v string) ([]*mail.Address, error) {
	list, err := parser.ParseList(v)
	if err == nil {
		return list, nil
	}
	var out []*mail.Address
	rest := v
	for {
		i := strings.IndexByte(rest, '<')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i:], '>')
		if j < 0 {
			return nil, err
		}
		a, aerr := mail.ParseAddress(rest[i : i+j+1])
		if aerr != nil || strings.IndexByte(rest[:i], '@') >= 0 {
			return nil, err
		}
		out = append(out, a)
		rest = rest[i+j+1:]
	}
	if len(out) == 0 || strings.IndexByte(rest, '@') >= 0 {
		return nil, err
	}
	return out, nil
}
