// Command testenv runs a real Kubernetes control plane on loopback for tests and local runs:
// embedded etcd in this process and kube-apiserver in a child process of the same binary.
//
// The apiserver runs as a child (not in-process) so it can be killed and started again on the same
// etcd while clients keep watching: that is what fault tests need, and kube-apiserver's global
// state (signal handler, metrics registry) does not allow a second start in one process.
//
// Protocol: once ready, one JSON line {"event":"ready",...} is printed on stdout. With
// --stdin-control, lines read from stdin are commands: "stop" kills the apiserver (SIGKILL, like a
// crash), "start" starts it again on the same port, "compact" compacts etcd's history up to its
// current revision (so a watch resumed from an older resourceVersion gets 410 Gone once the
// apiserver's watch cache no longer holds it), "quit" shuts down. EOF on stdin also shuts down,
// so a test process that dies never leaves a cluster behind.
//
// "testenv kustomize DIR" instead prints what `kubectl kustomize DIR` prints and exits
// (kustomize.go), so the tests can render manifests/ without kubectl.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

type options struct {
	dir           string
	kubeconfigOut string
	port          int
	etcdPort      int
	readyTimeout  time.Duration
	stdinControl  bool
	keep          bool
	shardedWatch  bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == apiserverRole {
		os.Exit(runAPIServer(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == kustomizeRole {
		os.Exit(runKustomize(os.Args[2:]))
	}
	var o options
	flag.StringVar(&o.dir, "dir", "", "working directory for etcd data, certificates and logs (default: a new temp dir, removed on exit)")
	flag.StringVar(&o.kubeconfigOut, "kubeconfig-out", "", "also write the admin kubeconfig to this path")
	flag.IntVar(&o.port, "port", 0, "apiserver secure port on 127.0.0.1 (0: pick a free one)")
	flag.IntVar(&o.etcdPort, "etcd-port", 0, "etcd client port on 127.0.0.1 (0: pick a free one)")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 90*time.Second, "how long to wait for etcd and the apiserver /readyz")
	flag.BoolVar(&o.stdinControl, "stdin-control", false, "read stop/start/compact/quit commands from stdin; exit on EOF")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory on exit")
	flag.BoolVar(&o.shardedWatch, "sharded-list-and-watch", true, "turn on the apiserver's ShardedListAndWatch feature gate (KEP-5866: list and watch with shardSelector); false runs without it")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	dir := o.dir
	removeDir := false
	if dir == "" {
		d, err := os.MkdirTemp("", "wcm-testenv-")
		if err != nil {
			return fmt.Errorf("create temp dir: %w", err)
		}
		dir, removeDir = d, !o.keep
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	cleanup := func() {
		if removeDir {
			_ = os.RemoveAll(dir)
		}
	}

	cluster, err := startCluster(o, dir)
	if err != nil {
		cleanup()
		return err
	}
	shutdown := sync.OnceFunc(func() {
		cluster.stop()
		cleanup()
	})
	defer shutdown()

	// The handler is in place before "ready" is printed, so a signal sent as soon as the line
	// is read still runs the cleanup (Go's default for SIGTERM exits without it).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	emit(cluster.readyEvent())
	fmt.Fprintf(os.Stderr, "testenv: kube-apiserver ready at %s\ntestenv: kubeconfig: %s\n", cluster.server(), cluster.kubeconfigPath)
	commands := make(chan string)
	if o.stdinControl {
		go readCommands(commands)
	}
	for {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "testenv: %s received, shutting down\n", s)
			return nil
		case err := <-cluster.apiserverExited():
			// An apiserver that dies on its own (not by "stop") ends the run: tests must not hang on it.
			return fmt.Errorf("kube-apiserver exited unexpectedly: %v\n%s", err, cluster.apiserverLogTail())
		case cmd, ok := <-commands:
			if !ok || cmd == "quit" {
				return nil
			}
			handleCommand(cluster, cmd, o.readyTimeout)
		}
	}
}

func handleCommand(c *cluster, cmd string, timeout time.Duration) {
	switch cmd {
	case "stop":
		c.killAPIServer()
		emit(map[string]any{"event": "stopped"})
	case "start":
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := c.startAPIServer(ctx); err != nil {
			emit(map[string]any{"event": "error", "error": err.Error()})
			return
		}
		emit(c.readyEvent())
	case "compact":
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		rev, err := c.compactEtcd(ctx)
		if err != nil {
			emit(map[string]any{"event": "error", "error": err.Error()})
			return
		}
		emit(map[string]any{"event": "compacted", "revision": rev})
	case "":
	default:
		emit(map[string]any{"event": "error", "error": fmt.Sprintf("unknown command %q (want stop, start, compact or quit)", cmd)})
	}
}

func readCommands(out chan<- string) {
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		out <- strings.TrimSpace(scanner.Text())
	}
	close(out)
}

var emitMu sync.Mutex

func emit(v any) {
	emitMu.Lock()
	defer emitMu.Unlock()
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{"event":"error","error":"marshal"}`)
	}
	fmt.Fprintln(os.Stdout, string(b))
}

func absPath(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

var errNotReady = errors.New("not ready")
