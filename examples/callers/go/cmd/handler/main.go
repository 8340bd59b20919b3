// An HTTP handler for `idem consume`, on Go's net/http.
//
//	go run ./cmd/handler 8083 effects.jsonl
//	idem consume --from 'redis://127.0.0.1:6379?stream=orders&group=shipping' \
//	    --key json:/order_id --to http://127.0.0.1:8083/
//
// idem consume POSTs each message with Idempotency-Key, Idem-Fencing-Token
// and Idem-Attempt. Answer 2xx when the work is done (idem stores the
// answer and acks), 4xx to refuse the message for good (dead letter), 5xx
// or 429 to have it retried (Retry-After is honoured). The write here is
// fenced: refused (409, retried) when a higher token was already written
// for the key.
//
// With idem consume --batch N a request carries Idem-Batch: COUNT and a
// JSON array of messages, each {key, token, attempt, headers, body}; the
// answer is {"results": [{key, status, outcome}]}, one result per message,
// each settled by its own status.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
)

// batchItem is one message of a batch.
type batchItem struct {
	Key   string          `json:"key"`
	Token uint64          `json:"token"`
	Body  json.RawMessage `json:"body"`
}

func main() {
	port, path := os.Args[1], os.Args[2]
	var mu sync.Mutex
	highest := map[string]uint64{}
	// apply is the fenced write: 200 when done, 409 when a later holder
	// wrote, 503 when the file cannot be written.
	apply := func(key string, token uint64, body any) int {
		mu.Lock()
		defer mu.Unlock()
		if highest[key] > token {
			return http.StatusConflict
		}
		line, _ := json.Marshal(map[string]any{"key": key, "token": token, "body": body})
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return http.StatusServiceUnavailable
		}
		_, err = f.Write(append(line, '\n'))
		f.Close()
		if err != nil {
			return http.StatusServiceUnavailable
		}
		highest[key] = token
		return http.StatusOK
	}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("content-type", "application/json")
		if r.Header.Get("Idem-Batch") != "" {
			var items []batchItem
			if err := json.Unmarshal(body, &items); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			results := make([]map[string]any, 0, len(items))
			for _, item := range items {
				results = append(results, map[string]any{
					"key":     item.Key,
					"status":  apply(item.Key, item.Token, item.Body),
					"outcome": map[string]string{"handled": item.Key},
				})
			}
			answer, _ := json.Marshal(map[string]any{"results": results})
			w.Write(answer)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		token, err := strconv.ParseUint(r.Header.Get("Idem-Fencing-Token"), 10, 64)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		status := apply(key, token, string(body))
		w.WriteHeader(status)
		answer, _ := json.Marshal(map[string]string{"handled": key})
		w.Write(answer)
	})
	fmt.Println("listening on", port)
	if err := http.ListenAndServe("127.0.0.1:"+port, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
