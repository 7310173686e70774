package main

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

// record is one line of the request log.
type record struct {
	// Time is when the request arrived, RFC 3339 with nanoseconds.
	Time   string `json:"time"`
	Method string `json:"method"`
	// Path without the query, e.g. /v2/plugins/pod-counter/manifests/v1.
	Path  string `json:"path"`
	Query string `json:"query"`
	// Status is the HTTP status the registry answered.
	Status int `json:"status"`
	// Bytes is the size of the response body (the Content-Length it declared, else what it wrote).
	Bytes int64 `json:"bytes"`
	// Auth says whether the request carried an Authorization header; User is the basic-auth user
	// it named (never the password), empty otherwise.
	Auth bool   `json:"auth"`
	User string `json:"user"`
	// Accept is the request's Accept header (which manifest media types the client takes).
	Accept string `json:"accept"`
	// ContentType is the response's Content-Type (e.g. the manifest's media type).
	ContentType string `json:"content_type"`
	// Digest is the response's Docker-Content-Digest header, when it has one.
	Digest string  `json:"digest"`
	MS     float64 `json:"ms"`
}

type requestLog struct {
	mu sync.Mutex
	f  *os.File
}

func openRequestLog(path string) (*requestLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &requestLog{f: f}, nil
}

func (l *requestLog) write(r *record) {
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.f.Write(append(b, '\n'))
}

// wrap logs every request. The line is written before the last byte of the response leaves the
// server (before the write that completes a declared Content-Length, or when the handler returns,
// before the server flushes the rest), so every request whose response a client has read in full
// is in the log when the client looks.
func (l *requestLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &record{
			Time:   start.UTC().Format(time.RFC3339Nano),
			Method: r.Method,
			Path:   r.URL.Path,
			Query:  r.URL.RawQuery,
			Accept: r.Header.Get("Accept"),
		}
		if h := r.Header.Get("Authorization"); h != "" {
			rec.Auth = true
			if user, _, ok := r.BasicAuth(); ok {
				rec.User = user
			}
		}
		lw := &loggingWriter{w: w, log: l, rec: rec, start: start, length: -1, head: r.Method == http.MethodHead}
		next.ServeHTTP(lw, r)
		lw.finish()
	})
}

// loggingWriter deliberately implements only http.ResponseWriter (no ReadFrom, no Flush): every
// body byte goes through Write, so the log line can be written before the last one.
type loggingWriter struct {
	w      http.ResponseWriter
	log    *requestLog
	rec    *record
	start  time.Time
	head   bool
	status int
	length int64 // declared Content-Length, -1 if none
	wrote  int64
	logged bool
}

func (lw *loggingWriter) Header() http.Header { return lw.w.Header() }

func (lw *loggingWriter) WriteHeader(status int) {
	if lw.status == 0 {
		lw.status = status
		if n, err := strconv.ParseInt(lw.w.Header().Get("Content-Length"), 10, 64); err == nil && n >= 0 {
			lw.length = n
		}
	}
	lw.w.WriteHeader(status)
}

func (lw *loggingWriter) Write(p []byte) (int, error) {
	if lw.status == 0 {
		lw.WriteHeader(http.StatusOK)
	}
	if !lw.head && lw.length >= 0 && lw.wrote+int64(len(p)) >= lw.length {
		lw.finish()
	}
	n, err := lw.w.Write(p)
	lw.wrote += int64(n)
	return n, err
}

func (lw *loggingWriter) finish() {
	if lw.logged {
		return
	}
	lw.logged = true
	if lw.status == 0 {
		lw.status = http.StatusOK
	}
	lw.rec.Status = lw.status
	if lw.length >= 0 {
		lw.rec.Bytes = lw.length
	} else {
		lw.rec.Bytes = lw.wrote
	}
	if lw.head {
		lw.rec.Bytes = 0
	}
	h := lw.w.Header()
	lw.rec.ContentType = h.Get("Content-Type")
	lw.rec.Digest = h.Get("Docker-Content-Digest")
	lw.rec.MS = float64(time.Since(lw.start).Microseconds()) / 1000
	lw.log.write(lw.rec)
}
