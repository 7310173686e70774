// Command testenv-registry runs a real OCI registry (CNCF distribution v3, in process) on loopback
// for the tests, and pushes wasm components to it.
//
//	testenv-registry [--tls] [--auth] [--stdin-control] ...   serve; print {"event":"ready",...}
//	testenv-registry push --registry HOST:PORT --repo R --tag T --wasm F [...]   push; print the digest
//
// serve listens on 127.0.0.1 only (port 0 unless --port), keeps its storage in a new temporary
// directory, and appends one JSON line per request to a request log (requestlog.go) that tests
// read to prove what the registry saw. With --tls it generates a CA and a server certificate for
// 127.0.0.1 and localhost (pki.go) and writes the CA to ca.pem; with --auth it requires HTTP basic
// auth (htpasswd, bcrypt) for a user and password it generates (or is given).
//
// With --stdin-control it reads line commands: "stop" closes the listener and every open
// connection (clients then get "connection refused") and answers {"event":"stopped"}; "start"
// listens again on the same port with the same storage and answers the ready line again; "quit"
// or EOF, like SIGTERM or SIGINT, stops it and removes its directory.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/bcrypt"

	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

type serveOptions struct {
	tls          bool
	auth         bool
	username     string
	password     string
	port         int
	dir          string
	keep         bool
	stdinControl bool
}

// ready is the line printed on stdout when the registry answers (and again after "start").
type ready struct {
	Event string `json:"event"`
	// URL is http(s)://127.0.0.1:PORT.
	URL string `json:"url"`
	// Host is 127.0.0.1:PORT, the registry part of a reference.
	Host string `json:"host"`
	// CAFile is the PEM of the CA that signed the server certificate; empty without --tls.
	CAFile string `json:"ca_file"`
	// Username and Password for basic auth; empty without --auth.
	Username string `json:"username"`
	Password string `json:"password"`
	// RequestLog holds one JSON line per request (requestlog.go).
	RequestLog string `json:"request_log"`
	// Storage is the filesystem driver's root directory.
	Storage string `json:"storage"`
	// Log is distribution's own log (warnings and errors).
	Log string `json:"log"`
	// Dir is the working directory, removed at stop.
	Dir string `json:"dir"`
	PID int    `json:"pid"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "push" {
		os.Exit(runPush(os.Args[2:]))
	}
	var o serveOptions
	flag.BoolVar(&o.tls, "tls", false, "serve HTTPS with a certificate from a CA generated here (written to DIR/ca.pem)")
	flag.BoolVar(&o.auth, "auth", false, "require HTTP basic auth (htpasswd)")
	flag.StringVar(&o.username, "username", "", "basic auth user (default: generated); implies --auth")
	flag.StringVar(&o.password, "password", "", "basic auth password (default: generated); implies --auth")
	flag.IntVar(&o.port, "port", 0, "port on 127.0.0.1 (default: a free one)")
	flag.StringVar(&o.dir, "dir", "", "working directory (default: a new temporary directory, removed at stop)")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory at stop")
	flag.BoolVar(&o.stdinControl, "stdin-control", false, "read stop/start/quit commands on stdin; stop on EOF")
	flag.Parse()
	if o.username != "" || o.password != "" {
		o.auth = true
	}
	if err := serve(o); err != nil {
		fmt.Fprintf(os.Stderr, "testenv-registry: %v\n", err)
		emit(map[string]any{"event": "error", "error": err.Error()})
		os.Exit(1)
	}
}

var stdoutMu sync.Mutex

func emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	stdoutMu.Lock()
	defer stdoutMu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// server is the registry with its listener; the handler (and storage) outlive a stop/start.
type server struct {
	handler   http.Handler
	tlsConfig *tls.Config
	info      ready

	mu   sync.Mutex
	addr string // 127.0.0.1:PORT once bound
	srv  *http.Server
}

func serve(o serveOptions) error {
	dir := o.dir
	owned := false
	if dir == "" {
		d, err := os.MkdirTemp("", "wcm-registry-")
		if err != nil {
			return err
		}
		dir, owned = d, true
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cleanup := func() {
		if owned && !o.keep {
			os.RemoveAll(dir)
		}
	}
	s, err := newServer(o, dir)
	if err != nil {
		cleanup()
		return err
	}
	defer cleanup()
	if err := s.start(fmt.Sprintf("127.0.0.1:%d", o.port)); err != nil {
		return err
	}
	defer s.stop()

	quit := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(quit) }) }
	// The handler is in place before "ready" is printed: a SIGTERM sent as soon as the line is
	// read must still remove the directory (Go's default for SIGTERM exits without cleanup).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; done() }()
	emit(s.ready())
	if o.stdinControl {
		go func() {
			defer done()
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				switch strings.TrimSpace(sc.Text()) {
				case "stop":
					s.stop()
					emit(map[string]any{"event": "stopped"})
				case "start":
					if err := s.start(""); err != nil {
						emit(map[string]any{"event": "error", "error": err.Error()})
					} else {
						emit(s.ready())
					}
				case "quit":
					return
				case "":
				default:
					emit(map[string]any{"event": "error", "error": "unknown command " + strconv.Quote(sc.Text())})
				}
			}
		}()
	}
	<-quit
	return nil
}

func newServer(o serveOptions, dir string) (*server, error) {
	storage := filepath.Join(dir, "storage")
	if err := os.MkdirAll(storage, 0o700); err != nil {
		return nil, err
	}
	info := ready{
		Event:      "ready",
		RequestLog: filepath.Join(dir, "requests.log"),
		Storage:    storage,
		Log:        filepath.Join(dir, "registry.log"),
		Dir:        dir,
		PID:        os.Getpid(),
	}
	authYAML := ""
	if o.auth {
		info.Username, info.Password = o.username, o.password
		if info.Username == "" {
			info.Username = "wcm-" + randomHex(4)
		}
		if info.Password == "" {
			info.Password = randomHex(16)
		}
		if strings.ContainsAny(info.Username, ":\n") {
			return nil, errors.New("the username must not hold ':' or a newline")
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(info.Password), bcrypt.MinCost)
		if err != nil {
			return nil, err
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(info.Username+":"+string(hash)+"\n"), 0o600); err != nil {
			return nil, err
		}
		authYAML = fmt.Sprintf("auth:\n  htpasswd:\n    realm: wcm-testenv-registry\n    path: %q\n", htpasswd)
	}
	// Deletion is on so that tests can remove a blob a manifest references; upload purging is
	// off (it runs in the background and only matters for days-old uploads).
	yaml := fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %q
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:0
  secret: %s
%s`, storage, randomHex(16), authYAML)
	config, err := configuration.Parse(strings.NewReader(yaml))
	if err != nil {
		return nil, fmt.Errorf("registry configuration: %w", err)
	}
	// distribution's own log (warnings and errors, e.g. every refused credential) goes to a
	// file beside the request log, not to the tests' output.
	logFile, err := os.OpenFile(filepath.Join(dir, "registry.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	logrus.SetOutput(logFile)
	logrus.SetLevel(logrus.WarnLevel)
	app, err := newApp(config)
	if err != nil {
		return nil, err
	}
	log, err := openRequestLog(info.RequestLog)
	if err != nil {
		return nil, err
	}
	s := &server{handler: log.wrap(app), info: info}
	if o.tls {
		info.CAFile = filepath.Join(dir, "ca.pem")
		cfg, err := generatePKI(info.CAFile)
		if err != nil {
			return nil, err
		}
		s.tlsConfig = cfg
		s.info.CAFile = info.CAFile
	}
	return s, nil
}

// newApp builds distribution's handler; it panics on a bad configuration, turned into an error.
func newApp(config *configuration.Configuration) (app http.Handler, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("start the registry: %v", r)
		}
	}()
	return handlers.NewApp(context.Background(), config), nil
}

// start listens on addr, or again on the address it had when addr is empty (retrying for a
// while: the port of a stopped server may be held for a moment), and serves.
func (s *server) start(addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	if addr == "" {
		addr = s.addr
	}
	var ln net.Listener
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	s.addr = ln.Addr().String()
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 30 * time.Second,
	}
	scheme := "http"
	if s.tlsConfig != nil {
		scheme = "https"
		srv.TLSConfig = s.tlsConfig
		ln = tls.NewListener(ln, s.tlsConfig)
	}
	s.srv = srv
	s.info.URL = scheme + "://" + s.addr
	s.info.Host = s.addr
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "testenv-registry: serve: %v\n", err)
		}
	}()
	return nil
}

// stop closes the listener and every connection, idle or busy.
func (s *server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return
	}
	s.srv.Close()
	s.srv = nil
}

func (s *server) ready() ready {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}
