package mailhdr

import (
	"slices"
	"testing"
)

func TestAddressesInAnyCharset(t *testing.T) {
	for _, v := range []string{
		"=?ISO-2022-JP?B?GyRCJTclZyVDJVcbKEI=?= <info@shop.example>",
		"=?windows-1252?Q?Caf=E9?= <info@shop.example>",
		"=?Shift_JIS?B?g1aDh4NigXY=?= <info@shop.example>",
		"info@shop.example",
		"\x1b$B%7%g%C%W\x1b(B <info@shop.example>", // raw ISO-2022-JP, not encoded
		"Caf\xe9 <info@shop.example>",              // raw windows-1252
	} {
		list, err := Addresses(v)
		if err != nil || len(list) != 1 || list[0].Address != "info@shop.example" {
			t.Errorf("%q: %v, %v", v, list, err)
		}
	}
	// A value net/mail refuses is read from its angle brackets only when
	// nothing outside them could be an address a reader is shown.
	for _, v := range []string{
		"ceo@bank.example; <a@shop.example>",
		"ceo@bank.example (<a@shop.example>",
		"Caf\xe9 <a@shop.example> ceo@bank.example",
		"Caf\xe9 <a@shop.example>, ceo@bank.example",
		"Caf\xe9 <a@shop.example>, Bank <ceo@bank.example", // an unclosed bracket
		"Caf\xe9 <a@shop.example>, <not an address>",
	} {
		if list, err := Addresses(v); err == nil {
			t.Errorf("%q: read as %v, want an error", v, list)
		}
	}
}

func TestValuesAndNames(t *testing.T) {
	msg := []byte("From: a@b.example\r\nSubject: \x1b$B$3$s\x1b(B\r\nTo: c@d.example,\r\n e@f.example\r\nreceived: x\r\nReceived: y\r\n\r\nFrom: not@header.example\r\n")
	if got := Values(msg, "to"); len(got) != 1 || got[0] != "c@d.example, e@f.example" {
		t.Errorf("To %q", got)
	}
	names := Names(msg)
	var list []string
	for n := range names {
		list = append(list, n)
	}
	slices.Sort(list)
	if !slices.Equal(list, []string{"from", "received", "subject", "to"}) {
		t.Errorf("names %v (a raw control byte in Subject, a From in the body)", list)
	}
	if names["from"] != 1 || names["received"] != 2 {
		t.Errorf("counts %v, want from 1 (the body's not counted) and received 2", names)
	}
}
