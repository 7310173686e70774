package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The node's fixed names and addresses. One node per machine at a time: kubelet and containerd
// keep a few host paths of their own (see stateDir), so a second node waits for the first.
const (
	bridgeName = "wcmnode0"
	// A fixed MAC: without it the bridge takes the lowest MAC of its ports and changes it when that
	// Pod goes, and the other Pods keep the old one in their ARP caches (unreachable for ~40 s).
	bridgeMAC  = "02:77:63:6d:00:01"
	nodeIP     = "10.244.0.1"
	podSubnet  = "10.244.0.0/24"
	cgroupName = "wcm-node"
	pauseImage = "wcm.test/pause:1"
	// Host paths kubelet and containerd use whatever they are told.
	stateDir         = "/run/wcm-testenv-node"
	devicePluginsDir = "/var/lib/kubelet/device-plugins"
	containerLogsDir = "/var/log/containers"
	netnsDir         = "/run/netns"
	containerdRunDir = "/run/containerd" // shim sockets (s/) and runc state (runc/)
)

// kernelSettings are the sysctls kubelet sets when protectKernelDefaults is false, and the ARP
// settings startNetwork sets; the node puts back what they were.
var kernelSettings = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/ipv4/conf/all/arp_ignore", "net/ipv4/conf/all/arp_announce",
}

type part struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

type node struct {
	o         options
	dir       string
	server    string // https://127.0.0.1:PORT
	clusterIP string
	client    *kubernetes.Clientset
	lock      *os.File
	relay     net.Listener
	parts     []*part
	exited    chan string
	stopping  bool
	mu        sync.Mutex
	state     nodeState
	kubeletPt int
}

// preflight says why this machine cannot run a node, or "" when it can.
func preflight() string {
	if os.Geteuid() != 0 {
		return "not root (a kubelet and containerd need root)"
	}
	if _, err := os.Stat("/sys/fs/cgroup/pids/cgroup.procs"); err != nil {
		if _, err2 := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err2 == nil {
			return "only cgroup v2 is mounted; the test node supports cgroup v1 hierarchies (or hybrid) so far"
		}
		return "no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids (no cgroups)"
	}
	for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("%s is not installed (scripts/setup installs containerd, runc, containernetworking-plugins and iproute2)", bin)
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, plugin)); err != nil {
			return fmt.Sprintf("the CNI plugin %s is not in %s (apt-get install containernetworking-plugins)", plugin, cniBinDir)
		}
	}
	return ""
}

const cniBinDir = "/usr/lib/cni"

func startNode(o options) (*node, error) {
	n := &node{o: o, exited: make(chan string, 8)}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", o.kubeconfig, err)
	}
	n.server = cfg.Host
	if n.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if err := n.lockMachine(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			n.stop()
		}
	}()
	if err := n.prepare(); err != nil {
		return nil, err
	}
	if err := n.startNetwork(); err != nil {
		return nil, err
	}
	if err := n.startContainerd(); err != nil {
		return nil, err
	}
	if err := n.loadPause(); err != nil {
		return nil, err
	}
	if err := n.startKubelet(); err != nil {
		return nil, err
	}
	if err := n.startControlPlaneParts(); err != nil {
		return nil, err
	}
	if err := n.waitNodeReady(); err != nil {
		return nil, err
	}
	ok = true
	return n, nil
}

// lockMachine takes the machine-wide node lock (waiting for a node of another test binary to
// finish) and cleans up after a node that died before it could.
func (n *node) lockMachine() error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(stateDir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(15 * time.Minute)
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			f.Close()
			return fmt.Errorf("another test node held %s/lock for 15 minutes", stateDir)
		}
		if !said {
			fmt.Fprintln(os.Stderr, "testenv-node: another test node runs on this machine; waiting for it to stop")
			said = true
		}
		time.Sleep(time.Second)
	}
	n.lock = f
	return sweepLeftovers()
}

func (n *node) prepare() error {
	dir := n.o.dir
	if dir == "" {
		d, err := os.MkdirTemp("/var/tmp", "wcm-node-")
		if err != nil {
			return err
		}
		dir = d
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	n.dir = abs
	n.state = nodeState{Dir: abs, Keep: n.o.keep || n.o.dir != "", Sysctls: map[string]string{}}
	for _, k := range kernelSettings {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil {
			n.state.Sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	n.state.NetnsBefore = listDir(netnsDir)
	for _, p := range []string{devicePluginsDir, containerLogsDir, containerdRunDir, netnsDir, "/var/lib/kubelet"} {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			n.state.Created = append(n.state.Created, p)
		}
	}
	if err := n.state.save(); err != nil {
		return err
	}
	for _, d := range []string{"containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "images", devicePluginsDir, containerLogsDir} {
		p := d
		if !filepath.IsAbs(d) {
			p = filepath.Join(n.dir, d)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(n.dir, "resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		return err
	}
	// Every process of the node (this one, containerd and its shims, the containers, kubelet, ...)
	// lives in the node's cgroups, so that stop (or the next node, after a crash) finds them all.
	return setupCgroups(&n.state)
}

func (n *node) socket() string { return filepath.Join(n.dir, "containerd", "containerd.sock") }

func (n *node) startContainerd() error {
	cfg := fmt.Sprintf(containerdConfig, n.dir, n.dir, n.socket(), n.socket(), pauseImage, cniBinDir, filepath.Join(n.dir, "cni/net.d"))
	path := filepath.Join(n.dir, "containerd.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.dir, "cni/net.d/10-wcm-node.conflist"), []byte(fmt.Sprintf(cniConfig, bridgeName, podSubnet, nodeIP, n.clusterIP, nodeIP, filepath.Join(n.dir, "cni/ipam"))), 0o644); err != nil {
		return err
	}
	if err := n.startPart("containerd", "containerd", "--config", path); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", n.socket()); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("containerd did not listen on %s in 30 s\n%s", n.socket(), n.logTail("containerd"))
}

// importImage loads an OCI image archive into the node's containerd (the namespace the kubelet uses).
func (n *node) importImage(archive string) error {
	out, err := exec.Command("ctr", "--address", n.socket(), "--namespace", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %v: %s", archive, err, out)
	}
	return nil
}

func (n *node) loadPause() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pause := filepath.Join(filepath.Dir(self), "pause")
	archive := filepath.Join(n.dir, "images", "pause.tar")
	spec := imageSpec{
		Name:       pauseImage,
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
		Files:      []imageFile{{Source: pause, Path: "/pause", Mode: 0o755}},
	}
	if err := writeImage(spec, archive); err != nil {
		return fmt.Errorf("build the pause image from %s: %w", pause, err)
	}
	return n.importImage(archive)
}

func (n *node) startKubelet() error {
	port, err := freePort(nodeIP)
	if err != nil {
		return err
	}
	n.kubeletPt = port
	cfg := fmt.Sprintf(kubeletConfig, nodeIP, port, cgroupName, n.socket(), filepath.Join(n.dir, "resolv.conf"), filepath.Join(n.dir, "pod-logs"))
	path := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	return n.startPart("kubelet", "", kubeletRole,
		"--config="+path,
		"--kubeconfig="+n.o.kubeconfig,
		"--root-dir="+filepath.Join(n.dir, "kubelet"),
		"--cert-dir="+filepath.Join(n.dir, "kubelet", "pki"),
		"--hostname-override="+n.o.name,
		"--node-ip="+nodeIP,
		"--v=1",
	)
}

func (n *node) startControlPlaneParts() error {
	ca := filepath.Join(n.dir, "ca.crt")
	raw, err := clientcmd.LoadFromFile(n.o.kubeconfig)
	if err != nil {
		return err
	}
	for _, c := range raw.Clusters {
		if err := os.WriteFile(ca, c.CertificateAuthorityData, 0o644); err != nil {
			return err
		}
		break
	}
	if err := n.startPart("kube-controller-manager", "", kcmRole,
		"--kubeconfig="+n.o.kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--root-ca-file="+ca,
		"--use-service-account-credentials=false",
		"--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle",
		"--concurrent-deployment-syncs=5",
		"--v=1",
	); err != nil {
		return err
	}
	return n.startPart("kube-scheduler", "", schedulerRole,
		"--kubeconfig="+n.o.kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	)
}

// startPart starts one process of the node, its output in DIR/NAME.log. bin "" is this binary.
func (n *node) startPart(name, bin string, args ...string) error {
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		bin = self
	}
	logFile, err := os.OpenFile(n.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = n.dir
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/sbin:/sbin")
	// Dies with this process even on SIGKILL; what it started is swept from the cgroups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &part{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.done)
		n.mu.Lock()
		stopping := n.stopping
		n.mu.Unlock()
		if !stopping {
			n.exited <- name
		}
	}()
	n.parts = append(n.parts, p)
	return nil
}

func (n *node) logPath(name string) string { return filepath.Join(n.dir, name+".log") }

func (n *node) logTail(name string) string {
	b, err := os.ReadFile(n.logPath(name))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

func (n *node) waitNodeReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), n.o.readyTimeout)
	defer cancel()
	last := "not registered"
	for {
		select {
		case part := <-n.exited:
			return fmt.Errorf("%s exited while the node started:\n%s", part, n.logTail(part))
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready in %s (%s); kubelet log:\n%s", n.o.name, n.o.readyTimeout, last, n.logTail("kubelet"))
		case <-time.After(200 * time.Millisecond):
		}
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.o.name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			continue
		}
		for _, c := range node.Status.Conditions {
			if c.Type == "Ready" {
				last = fmt.Sprintf("Ready=%s: %s", c.Status, c.Message)
				if c.Status == "True" {
					return nil
				}
			}
		}
	}
}

func (n *node) readyEvent() map[string]any {
	return map[string]any{
		"event":             "ready",
		"node":              n.o.name,
		"dir":               n.dir,
		"containerd_socket": n.socket(),
		"pod_logs":          filepath.Join(n.dir, "pod-logs"),
		"node_ip":           nodeIP,
		"bridge":            bridgeName,
		"pod_subnet":        podSubnet,
		"cluster_ip":        n.clusterIP,
		"node_pid":          os.Getpid(),
	}
}

// stop ends every part and removes what the node made.
func (n *node) stop() {
	n.mu.Lock()
	n.stopping = true
	n.mu.Unlock()
	// The kubelet first, so that it does not start what is being removed.
	for i := len(n.parts) - 1; i >= 0; i-- {
		if p := n.parts[i]; p.name != "containerd" {
			terminate(p, 10*time.Second)
		}
	}
	if n.dir != "" {
		removeSandboxes(n.socket())
	}
	for _, p := range n.parts {
		if p.name == "containerd" {
			terminate(p, 10*time.Second)
		}
	}
	if n.relay != nil {
		n.relay.Close()
	}
	if err := sweepLeftovers(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv-node: cleanup: %v\n", err)
	}
	if n.lock != nil {
		n.lock.Close()
	}
}

func terminate(p *part, grace time.Duration) {
	if p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func listDir(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
