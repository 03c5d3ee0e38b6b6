package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/queue"
)

// BucketKeys is the key-value bucket of API keys: one entry per key, named
// by the SHA-256 of the key, holding a KeyInfo. The key itself is never
// stored; `outflow apikey create` prints it once.
const BucketKeys = "outflow_apikeys"

// KeyPrefix starts every API key, so that a key pasted into the wrong place
// (a log, a repository) can be recognised by scanners.
const KeyPrefix = "ofk_"

// keyBytes is the key's entropy: 256 bits, so that a single unsalted hash
// is enough (no password-style stretching is needed for a random key).
const keyBytes = 32

// ErrNoKey is returned by Keys.Lookup and Keys.Revoke for a key that does
// not exist or was revoked.
var ErrNoKey = errors.New("no such API key")

// KeyInfo is what is stored about one API key.
type KeyInfo struct {
	ID      string    `json:"id"` // the first 12 hex digits of the key's hash: what list shows and revoke takes
	Tenant  string    `json:"tenant"`
	Admin   bool      `json:"admin,omitempty"` // may act for every tenant (the console, other tenants' messages)
	Created time.Time `json:"created"`
	// Hash is the hex SHA-256 of the key; compared in constant time on use.
	Hash string `json:"hash"`
}

// Keys is the API key store.
type Keys struct{ kv jetstream.KeyValue }

// Bucketer opens or creates a key-value bucket: *queue.Queue's KeyValue.
type Bucketer interface {
	KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error)
}

// OpenKeys opens (creating it if need be) the API key bucket.
func OpenKeys(ctx context.Context, b Bucketer) (*Keys, error) {
	kv, err := b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketKeys, Description: "outflow API keys (SHA-256 hashes)", History: 1})
	if err != nil {
		return nil, err
	}
	return &Keys{kv: kv}, nil
}

// hashKey returns the hex SHA-256 of key.
func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// entryName is the bucket key of a hash: "<id>.<rest>", so that Revoke
// finds a key by its id with a subject filter instead of a scan.
func entryName(hash string) string { return hash[:12] + "." + hash[12:] }

// validTenant reports whether t can name a tenant: the characters of an
// SMTP AUTH user name that are also safe in subjects and logs.
func validTenant(t string) bool {
	if t == "" || len(t) > 64 {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.@+", c) >= 0) {
			return false
		}
	}
	return true
}

// Create makes a key for tenant and returns it with its stored info. The
// key is returned only here.
func (k *Keys) Create(ctx context.Context, tenant string, admin bool) (string, *KeyInfo, error) {
	if !validTenant(tenant) {
		return "", nil, fmt.Errorf("tenant %q: want 1 to 64 letters, digits or -_.@+", tenant)
	}
	if tenant == queue.PostmasterTenant {
		// (An admin key reads it with ?tenant=postmaster.) "trusted" is
		// allowed: an application that submits from a trusted network
		// follows its mail through a key of that tenant.
		return "", nil, fmt.Errorf("tenant %q is reserved for the postmaster and abuse mail forwarded to the operator", tenant)
	}
	var raw [keyBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", nil, err
	}
	key := KeyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	h := hashKey(key)
	info := &KeyInfo{ID: h[:12], Tenant: tenant, Admin: admin, Created: time.Now().UTC().Truncate(time.Second), Hash: h}
	b, err := json.Marshal(info)
	if err != nil {
		return "", nil, err
	}
	if _, err := k.kv.Create(ctx, entryName(h), b); err != nil {
		return "", nil, fmt.Errorf("store API key: %w", err)
	}
	return key, info, nil
}

// Lookup returns the info of key, or ErrNoKey.
func (k *Keys) Lookup(ctx context.Context, key string) (*KeyInfo, error) {
	if !strings.HasPrefix(key, KeyPrefix) || len(key) > 128 {
		return nil, ErrNoKey
	}
	h := hashKey(key)
	e, err := k.kv.Get(ctx, entryName(h))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNoKey
	}
	if err != nil {
		return nil, fmt.Errorf("API key: %w", err)
	}
	var info KeyInfo
	if err := json.Unmarshal(e.Value(), &info); err != nil {
		return nil, fmt.Errorf("API key %s: %w", h[:12], err)
	}
	// The bucket key already matched; the constant-time compare keeps a
	// corrupted or hand-edited entry from vouching for another key.
	if subtle.ConstantTimeCompare([]byte(info.Hash), []byte(h)) != 1 {
		return nil, ErrNoKey
	}
	return &info, nil
}

// List returns every key's info, by tenant then creation time.
func (k *Keys) List(ctx context.Context) ([]KeyInfo, error) {
	lister, err := k.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	var out []KeyInfo
	for name := range lister.Keys() {
		e, err := k.kv.Get(ctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // revoked meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("list API keys: %w", err)
		}
		var info KeyInfo
		if json.Unmarshal(e.Value(), &info) == nil {
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].Created.Before(out[j].Created)
	})
	return out, nil
}

// Revoke deletes the key whose id (KeyInfo.ID) is id. A revoked key is
// refused from the next request on: Lookup reads the bucket every time.
func (k *Keys) Revoke(ctx context.Context, id string) (*KeyInfo, error) {
	id = strings.ToLower(id)
	if len(id) != 12 || strings.Trim(id, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("%w: %q (an id is the 12 hex digits `apikey list` shows)", ErrNoKey, id)
	}
	lister, err := k.kv.ListKeysFiltered(ctx, id+".*")
	if err != nil {
		return nil, fmt.Errorf("revoke API key: %w", err)
	}
	var found *KeyInfo
	for name := range lister.Keys() {
		e, err := k.kv.Get(ctx, name)
		if err != nil {
			continue
		}
		var info KeyInfo
		if json.Unmarshal(e.Value(), &info) != nil {
			continue
		}
		// Purge, not Delete: nothing of the key's hash is kept.
		if err := k.kv.Purge(ctx, name); err != nil {
			return nil, fmt.Errorf("revoke API key %s: %w", id, err)
		}
		found = &info
	}
	if found == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoKey, id)
	}
	return found, nil
}
