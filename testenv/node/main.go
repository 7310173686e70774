// Command testenv-node runs a real Kubernetes node on this machine for the tests, against a
// testenv cluster (../): containerd (Debian's, with runc and the CNI bridge plugin), a kubelet,
// kube-controller-manager and kube-scheduler built from the same k8s.io/kubernetes version as the
// apiserver, a locally built pause image, and a bridge that keeps every packet on the machine.
//
//	testenv-node --kubeconfig KC [--stdin-control]   start a node; print {"event":"ready",...}
//	testenv-node image SPEC.json OUT.tar             write an OCI image archive (image.go)
//
// When the machine cannot run a node (not root, no cgroup v1 hierarchies, containerd/runc/CNI
// plugins missing) it prints {"event":"unavailable","reason":...} and exits 3, so tests can say
// why they skip. Once ready, EOF or "quit" on stdin (with --stdin-control), SIGTERM or SIGINT stop
// the node and remove everything it made: processes, mounts, network namespaces, the bridge,
// cgroups, the kernel settings kubelet changed, and its directory.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// exitUnavailable is the exit code for "this machine cannot run a node".
const exitUnavailable = 3

type options struct {
	kubeconfig   string
	dir          string
	name         string
	stdinControl bool
	readyTimeout time.Duration
	keep         bool
}

func main() {
	if code, ok := runRole(os.Args[1:]); ok {
		os.Exit(code)
	}
	if len(os.Args) > 1 && os.Args[1] == "image" {
		os.Exit(runImage(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "cleanup" {
		// Removes what a node that was killed before it could clean up left behind.
		if err := sweepLeftovers(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv-node: cleanup: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "admin kubeconfig of the testenv cluster (required)")
	flag.StringVar(&o.dir, "dir", "", "working directory (default: a new directory under /var/tmp, removed at stop)")
	flag.StringVar(&o.name, "name", "wcm-node", "the Node's name")
	flag.BoolVar(&o.stdinControl, "stdin-control", false, "stop on EOF or \"quit\" on stdin")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 120*time.Second, "how long to wait for the Node to be Ready")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory (logs) at stop")
	flag.Parse()
	if o.kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "testenv-node: --kubeconfig is required")
		os.Exit(2)
	}
	if reason := preflight(); reason != "" {
		emit(map[string]any{"event": "unavailable", "reason": reason})
		fmt.Fprintf(os.Stderr, "testenv-node: this machine cannot run a node: %s\n", reason)
		os.Exit(exitUnavailable)
	}
	n, err := startNode(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv-node: %v\n", err)
		emit(map[string]any{"event": "error", "error": err.Error()})
		os.Exit(1)
	}
	stop := sync.OnceFunc(n.stop)
	defer stop()
	// The handler is in place before "ready" is printed, so a signal sent as soon as the line
	// is read still runs the cleanup (Go's default for SIGTERM exits without it).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	emit(n.readyEvent())
	fmt.Fprintf(os.Stderr, "testenv-node: node %s ready (logs in %s)\n", o.name, n.dir)
	commands := make(chan string)
	if o.stdinControl {
		go func() {
			scanner := bufio.NewScanner(os.Stdin)
			for scanner.Scan() {
				commands <- strings.TrimSpace(scanner.Text())
			}
			close(commands)
		}()
	}
	for {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "testenv-node: %s received, stopping the node\n", s)
			return
		case part := <-n.exited:
			fmt.Fprintf(os.Stderr, "testenv-node: %s exited unexpectedly; stopping the node\n%s\n", part, n.logTail(part))
			emit(map[string]any{"event": "error", "error": part + " exited unexpectedly"})
			stop()
			os.Exit(1)
		case cmd, ok := <-commands:
			if !ok || cmd == "quit" {
				return
			}
			if cmd != "" {
				emit(map[string]any{"event": "error", "error": fmt.Sprintf("unknown command %q (want quit)", cmd)})
			}
		}
	}
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
