package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/embed"
)

// cluster is one etcd (in-process) plus one kube-apiserver (child process).
type cluster struct {
	dir            string
	port           int
	etcdURL        string
	token          string
	kubeconfigPath string
	kubeconfigOut  string
	caPool         *x509.CertPool
	files          pkiFiles
	etcd           *embed.Etcd
	// The ShardedListAndWatch feature gate (KEP-5866, alpha in 1.36) of the apiserver.
	shardedWatch bool

	mu      sync.Mutex
	child   *exec.Cmd
	exited  chan error // receives when the current child exits without being asked to
	killing bool
}

func startCluster(o options, dir string) (*cluster, error) {
	files, err := writePKI(dir)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(auditPolicyPath(dir), []byte(auditPolicy), 0o600); err != nil {
		return nil, fmt.Errorf("write audit policy: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(files.caPEM)

	// As for the apiserver below: a port picked as free can be taken before etcd listens on it
	// (seen in CI); with automatic ports, pick again.
	var etcd *embed.Etcd
	var etcdURL string
	for i := 0; i < 3; i++ {
		etcd, etcdURL, err = startEtcd(dir, o.etcdPort, o.readyTimeout)
		if err == nil || o.etcdPort != 0 || !errors.Is(err, errPortInUse) {
			break
		}
		// etcd may have written its data directory before it failed to listen.
		os.RemoveAll(filepath.Join(dir, "etcd"))
	}
	if err != nil {
		return nil, err
	}
	c := &cluster{
		dir:           dir,
		etcdURL:       etcdURL,
		token:         files.token,
		caPool:        pool,
		files:         files,
		shardedWatch:  o.shardedWatch,
		etcd:          etcd,
		kubeconfigOut: o.kubeconfigOut,
		exited:        make(chan error, 1),
	}

	// A port picked as free can be taken before the apiserver binds it; with an automatic port we
	// simply pick again. An explicit --port that is taken is the user's to fix.
	attempts := 1
	if o.port == 0 {
		attempts = 3
	}
	for i := 0; i < attempts; i++ {
		c.port = o.port
		if c.port == 0 {
			if c.port, err = freePort(); err != nil {
				break
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), o.readyTimeout)
		err = c.startAPIServer(ctx)
		cancel()
		if err == nil || !errors.Is(err, errPortInUse) {
			break
		}
	}
	if err != nil {
		c.stop()
		return nil, err
	}
	if err := c.writeKubeconfigs(); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func startEtcd(dir string, port int, timeout time.Duration) (*embed.Etcd, string, error) {
	var err error
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, "", err
		}
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL := mustURL(fmt.Sprintf("http://127.0.0.1:%d", port))
	peerURL := mustURL(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	cfg := embed.NewConfig()
	cfg.Name = "testenv"
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ListenClientUrls = []url{clientURL}
	cfg.AdvertiseClientUrls = []url{clientURL}
	cfg.ListenPeerUrls = []url{peerURL}
	cfg.AdvertisePeerUrls = []url{peerURL}
	cfg.InitialCluster = fmt.Sprintf("testenv=%s", peerURL.String())
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	// Without this, embedded etcd logs every request as slow.
	cfg.WarningUnaryRequestDuration = 300 * time.Millisecond
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		if isAddrInUse(err) {
			return nil, "", fmt.Errorf("port clash: etcd cannot listen on 127.0.0.1:%d: %w (%w)", port, errPortInUse, err)
		}
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("etcd failed: %w", err)
	case <-time.After(timeout):
		e.Close()
		return nil, "", fmt.Errorf("etcd not ready after %s (log: %s)", timeout, filepath.Join(dir, "etcd.log"))
	}
	return e, clientURL.String(), nil
}

var errPortInUse = errors.New("port in use")

func (c *cluster) server() string { return fmt.Sprintf("https://127.0.0.1:%d", c.port) }

func (c *cluster) logPath() string { return filepath.Join(c.dir, "apiserver.log") }

func (c *cluster) auditLogPath() string { return filepath.Join(c.dir, "audit.log") }

func auditPolicyPath(dir string) string { return filepath.Join(dir, "audit-policy.yaml") }

// auditPolicy records who did what to which object, so tests can prove security properties by what
// the apiserver saw. Metadata level only: request and response bodies (Secret values) never reach
// the log. Health probes, /metrics and the apiserver's own loopback traffic are left out as noise.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  nonResourceURLs: ["/healthz*", "/readyz*", "/livez*", "/metrics"]
- level: None
  users: ["system:apiserver"]
- level: None
  namespaces: ["kube-system"]
  resources:
  - group: coordination.k8s.io
    resources: ["leases"]
- level: Metadata
`

func (c *cluster) apiserverArgs() []string {
	return []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.port),
		"--cert-dir=" + filepath.Join(c.dir, "certs"),
		"--tls-cert-file=" + c.files.servingCert,
		"--tls-private-key-file=" + c.files.servingKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.files.saPublic,
		"--service-account-signing-key-file=" + c.files.saPrivate,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--token-auth-file=" + c.files.tokens,
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none",
		"--audit-policy-file=" + auditPolicyPath(c.dir),
		"--audit-log-path=" + c.auditLogPath(),
		"--audit-log-format=json",
		// Blocking: an event is written before its response completes, so a test can read it right after.
		"--audit-log-mode=blocking",
		// 0 disables rotation: the file only grows, and a restarted apiserver appends to it.
		"--audit-log-maxsize=0",
		"--v=0",
		fmt.Sprintf("--feature-gates=ShardedListAndWatch=%t", c.shardedWatch),
	}
}

// startAPIServer starts the child and waits for /readyz.
func (c *cluster) startAPIServer(ctx context.Context) error {
	c.mu.Lock()
	if c.child != nil {
		c.mu.Unlock()
		return errors.New("kube-apiserver is already running")
	}
	self, err := os.Executable()
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("find own executable: %w", err)
	}
	logFile, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("open apiserver log: %w", err)
	}
	offset, _ := logFile.Seek(0, 2)
	cmd := exec.Command(self, append([]string{apiserverRole}, c.apiserverArgs()...)...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// The apiserver dies with us, even on SIGKILL: no orphans.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		c.mu.Unlock()
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	c.child = cmd
	c.killing = false
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		logFile.Close()
		c.mu.Lock()
		asked := c.killing
		if c.child == cmd {
			c.child = nil
		}
		c.mu.Unlock()
		done <- err
		if !asked {
			select {
			case c.exited <- err:
			default:
			}
		}
	}()
	c.mu.Unlock()

	if err := c.waitReady(ctx, done); err != nil {
		c.killAPIServer()
		tail := c.logSince(offset)
		if strings.Contains(tail, "address already in use") {
			return fmt.Errorf("port clash: kube-apiserver cannot bind 127.0.0.1:%d: %w\n%s", c.port, errPortInUse, lastLines(tail, 5))
		}
		return fmt.Errorf("%w\nlast lines of %s:\n%s", err, c.logPath(), lastLines(tail, 15))
	}
	return nil
}

func (c *cluster) waitReady(ctx context.Context, exited <-chan error) error {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.caPool}},
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastErr := errNotReady
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("kube-apiserver exited before it was ready: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready at %s/readyz in time: %v", c.server(), lastErr)
		case <-tick.C:
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.server()+"/readyz", nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+c.token)
			resp, err := client.Do(req)
			if err != nil {
				lastErr = err
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				// The exited channel may fire later; put a spare reader in place so the goroutine never blocks.
				go func() { <-exited }()
				return nil
			}
			lastErr = fmt.Errorf("/readyz answered %s", resp.Status)
		}
	}
}

// killAPIServer kills the child at once, as a crash would, and waits for it to go.
func (c *cluster) killAPIServer() {
	c.mu.Lock()
	cmd := c.child
	c.killing = true
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	for i := 0; i < 100; i++ {
		c.mu.Lock()
		gone := c.child == nil
		c.mu.Unlock()
		if gone {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) apiserverExited() <-chan error { return c.exited }

// compactEtcd drops etcd's history before its current revision, as the apiserver's own periodic
// compaction would, and returns that revision.
func (c *cluster) compactEtcd(ctx context.Context) (int64, error) {
	rev := c.etcd.Server.KV().Rev()
	if _, err := c.etcd.Server.Compact(ctx, &etcdserverpb.CompactionRequest{Revision: rev, Physical: true}); err != nil {
		return 0, fmt.Errorf("compact etcd at revision %d: %w", rev, err)
	}
	return rev, nil
}

// stop ends the apiserver gracefully (SIGTERM, then SIGKILL) and closes etcd.
func (c *cluster) stop() {
	c.mu.Lock()
	cmd := c.child
	c.killing = true
	c.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		for i := 0; i < 100; i++ {
			c.mu.Lock()
			gone := c.child == nil
			c.mu.Unlock()
			if gone {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.killAPIServer()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
}

func (c *cluster) apiserverLogTail() string {
	b, err := os.ReadFile(c.logPath())
	if err != nil {
		return ""
	}
	return lastLines(string(b), 15)
}

func (c *cluster) logSince(offset int64) string {
	b, err := os.ReadFile(c.logPath())
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

func (c *cluster) readyEvent() map[string]any {
	c.mu.Lock()
	pid := 0
	if c.child != nil && c.child.Process != nil {
		pid = c.child.Process.Pid
	}
	c.mu.Unlock()
	return map[string]any{
		"event":          "ready",
		"server":         c.server(),
		"kubeconfig":     c.kubeconfigPath,
		"token":          c.token,
		"dir":            c.dir,
		"etcd":           c.etcdURL,
		"apiserver_pid":  pid,
		"apiserver_log":  c.logPath(),
		"audit_log":      c.auditLogPath(),
		"testenv_pid":    os.Getpid(),
		"ca_certificate": c.files.caFile,
	}
}

func (c *cluster) writeKubeconfigs() error {
	c.kubeconfigPath = filepath.Join(c.dir, "kubeconfig")
	body := kubeconfig(c.server(), c.files.caPEM, c.token)
	if err := os.WriteFile(c.kubeconfigPath, body, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	if c.kubeconfigOut != "" {
		out := absPath(c.kubeconfigOut)
		if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
			return fmt.Errorf("write kubeconfig: %w", err)
		}
		if err := os.WriteFile(out, body, 0o600); err != nil {
			return fmt.Errorf("write kubeconfig: %w", err)
		}
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
