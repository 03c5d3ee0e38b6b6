package api

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestKeysStoreOnlyHashesAndRevokeTakesEffect(t *testing.T) {
	q := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	keys, err := OpenKeys(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	key, info, err := keys.Create(ctx, "acme", true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, KeyPrefix) || len(key) < 40 {
		t.Fatalf("key %q", key)
	}
	got, err := keys.Lookup(ctx, key)
	if err != nil || got.Tenant != "acme" || !got.Admin || got.ID != info.ID {
		t.Fatalf("lookup: %+v %v", got, err)
	}
	// Nothing in the bucket holds the key itself.
	lister, err := keys.kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name := range lister.Keys() {
		e, err := keys.kv.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		secret := strings.TrimPrefix(key, KeyPrefix)
		if strings.Contains(name, secret) || strings.Contains(string(e.Value()), secret) {
			t.Fatalf("bucket entry %s holds the key", name)
		}
	}
	second, _, err := keys.Create(ctx, "beta", false)
	if err != nil {
		t.Fatal(err)
	}
	list, err := keys.List(ctx)
	if err != nil || len(list) != 2 || list[0].Tenant != "acme" || list[1].Tenant != "beta" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if _, err := keys.Revoke(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Lookup(ctx, key); !errors.Is(err, ErrNoKey) {
		t.Fatalf("revoked key: %v", err)
	}
	if _, err := keys.Lookup(ctx, second); err != nil {
		t.Fatalf("the other key: %v", err)
	}
	if _, err := keys.Revoke(ctx, info.ID); !errors.Is(err, ErrNoKey) {
		t.Fatalf("second revoke: %v", err)
	}
	if _, _, err := keys.Create(ctx, "postmaster", false); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("a key for the forwarded reports' tenant: %v, want refused", err)
	}
	if _, _, err := keys.Create(ctx, "bad tenant", false); err == nil {
		t.Fatal("tenant with a space accepted")
	}
}
