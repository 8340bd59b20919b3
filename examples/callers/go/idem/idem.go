// Package idem runs a unit of work once per key through `idem serve`, with
// Go's net/http.
//
//	c := idem.New("http://127.0.0.1:7700")
//	receipt, err := c.Once(ctx, "payments", "order-42", func() (any, error) { return chargeCard(42) })
//
// Once claims the key (begin); the first caller runs the work while the
// lease is renewed in the background (extend), stores its result
// (complete) and returns it as JSON. A caller that arrives while the work
// runs waits as told (retry_after_ms) and returns the stored result; so
// does every later one. Work that fails releases the key (release), so the
// next delivery runs it again.
package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// ErrStale is a 409: the lease ran out and another holder took over.
var ErrStale = errors.New("idem: the token is stale")

// Client calls one idem serve.
type Client struct {
	URL     string
	LeaseMs int64
	Wait    time.Duration
	HTTP    *http.Client
}

// New is a client with a 30 s lease.
func New(url string) *Client {
	return &Client{
		URL:     strings.TrimRight(url, "/"),
		LeaseMs: 30_000,
		Wait:    2 * time.Minute,
		HTTP:    &http.Client{Timeout: 10 * time.Second},
	}
}

type begin struct {
	Status       string          `json:"status"`
	Token        uint64          `json:"token"`
	RetryAfterMs int64           `json:"retry_after_ms"`
	Outcome      json.RawMessage `json:"outcome"`
}

func (c *Client) post(ctx context.Context, ns, op string, body any, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/v1/"+ns+"/"+op, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusConflict:
		return ErrStale
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("idem: %s: %d %s", op, resp.StatusCode, text)
	case out != nil:
		return json.Unmarshal(text, out)
	}
	return nil
}

// Once runs work at most once for (ns, key) and returns its result as
// JSON, for this caller and every later one.
func (c *Client) Once(ctx context.Context, ns, key string, work func() (any, error)) (json.RawMessage, error) {
	deadline := time.Now().Add(c.Wait)
	for {
		var b begin
		if err := c.post(ctx, ns, "begin", map[string]any{"key": key, "lease_ms": c.LeaseMs}, &b); err != nil {
			return nil, err
		}
		switch b.Status {
		case "completed":
			return b.Outcome, nil
		case "mismatch":
			return nil, fmt.Errorf("idem: %s: the same key was used for a different request", key)
		case "in_progress":
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("idem: %s: still in progress", key)
			}
			select {
			case <-time.After(time.Duration(b.RetryAfterMs) * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case "acquired":
			return c.run(ctx, ns, key, b.Token, work)
		default:
			return nil, fmt.Errorf("idem: begin answered %q", b.Status)
		}
	}
}

func (c *Client) run(ctx context.Context, ns, key string, token uint64, work func() (any, error)) (json.RawMessage, error) {
	var lost atomic.Bool
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		// Extend at a third of the lease, so two renewals can fail before
		// it runs out.
		tick := time.NewTicker(time.Duration(c.LeaseMs/3) * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				err := c.post(ctx, ns, "extend", map[string]any{"key": key, "token": token, "lease_ms": c.LeaseMs}, nil)
				if errors.Is(err, ErrStale) {
					lost.Store(true)
					return
				}
			}
		}
	}()
	outcome, err := work()
	close(stop)
	<-renewed
	if err != nil {
		_ = c.post(ctx, ns, "release", map[string]any{"key": key, "token": token}, nil)
		return nil, err
	}
	raw, jerr := json.Marshal(outcome)
	if jerr != nil {
		_ = c.post(ctx, ns, "release", map[string]any{"key": key, "token": token}, nil)
		return nil, jerr
	}
	if lost.Load() {
		return nil, fmt.Errorf("idem: %s: the lease was lost before the result was stored", key)
	}
	err = c.post(ctx, ns, "complete", map[string]any{"key": key, "token": token, "outcome": json.RawMessage(raw)}, nil)
	if errors.Is(err, ErrStale) {
		return nil, fmt.Errorf("idem: %s: the lease was lost before the result was stored", key)
	}
	return raw, err
}
