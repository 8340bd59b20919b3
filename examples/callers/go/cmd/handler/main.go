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

func main() {
	port, path := os.Args[1], os.Args[2]
	var mu sync.Mutex
	highest := map[string]uint64{}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		token, err := strconv.ParseUint(r.Header.Get("Idem-Fencing-Token"), 10, 64)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if highest[key] > token {
			w.WriteHeader(http.StatusConflict)
			return
		}
		highest[key] = token
		line, _ := json.Marshal(map[string]any{"key": key, "token": token, "body": string(body)})
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, err = f.Write(append(line, '\n'))
		f.Close()
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("content-type", "application/json")
		answer, _ := json.Marshal(map[string]string{"handled": key})
		w.Write(answer)
	})
	fmt.Println("listening on", port)
	if err := http.ListenAndServe("127.0.0.1:"+port, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
