// Checks the idem client against a running `idem serve`: eight callers of
// one key run the work once and all get its result; work longer than the
// lease keeps its claim by renewing it; work that fails releases the key,
// so the next call runs it again.
//
//	go run ./cmd/check_once http://127.0.0.1:7700
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"idem.example/callers/idem"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "go: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	ctx := context.Background()
	c := idem.New(os.Args[1])
	c.LeaseMs = 300 // shorter than the work: renewals must hold it
	key := fmt.Sprintf("go-%d", time.Now().UnixNano())
	var runs atomic.Int32
	work := func() (any, error) {
		n := runs.Add(1)
		time.Sleep(time.Second)
		return map[string]string{"receipt": fmt.Sprintf("r-%d", n)}, nil
	}
	results := make([]string, 8)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := c.Once(ctx, "callers", key, work)
			if err != nil {
				fail("%v", err)
			}
			results[i] = string(r)
		}(i)
	}
	wg.Wait()
	if runs.Load() != 1 {
		fail("the work ran %d times", runs.Load())
	}
	for _, r := range results {
		if r != `{"receipt":"r-1"}` {
			fail("a caller got %s", r)
		}
	}

	other := key + "-b"
	if _, err := c.Once(ctx, "callers", other, func() (any, error) { return nil, errors.New("card declined") }); err == nil {
		fail("the failure was swallowed")
	}
	second, err := c.Once(ctx, "callers", other, func() (any, error) { return "second try", nil })
	if err != nil || string(second) != `"second try"` {
		fail("after a failure: %s %v", second, err)
	}
	third, err := c.Once(ctx, "callers", other, func() (any, error) { return "third try", nil })
	if err != nil || string(third) != `"second try"` {
		fail("a repeat ran again: %s %v", third, err)
	}
	fmt.Println("go: ok")
}
