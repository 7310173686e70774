package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// startNetwork makes the node's bridge: the node's address (kubelet listens there; the node IP
// cannot be loopback) and the kubernetes Service's ClusterIP as a /32, whose port 443 this process
// relays to the apiserver on loopback (there is no kube-proxy). Nothing here routes: ip_forward is
// left as it is (0 on these machines) and the Pods get no default route, so a Pod's packets reach
// only the bridge's subnet and these two local addresses.
func (n *node) startNetwork() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		svc, err := n.client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err == nil && svc.Spec.ClusterIP != "" {
			n.clusterIP = svc.Spec.ClusterIP
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the apiserver has no kubernetes Service with a ClusterIP: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if ip := net.ParseIP(n.clusterIP); ip == nil || ip.To4() == nil {
		return fmt.Errorf("the kubernetes Service's ClusterIP %q is not IPv4", n.clusterIP)
	}
	// The bridge's addresses are local to the whole machine, and Linux answers ARP for a local
	// address on any interface by default: a neighbour on the machine's own network asking for
	// 10.0.0.1 (a common gateway) would get this machine's MAC. arp_ignore=1 answers only on the
	// interface that holds the address (the bridge), arp_announce=2 never uses it as the source of
	// an ARP request elsewhere. Put back at stop (kernelSettings).
	for k, v := range map[string]string{"net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2"} {
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
			return fmt.Errorf("set %s=%s: %w", k, v, err)
		}
	}
	for _, args := range [][]string{
		{"link", "add", bridgeName, "type", "bridge"},
		{"link", "set", "dev", bridgeName, "address", bridgeMAC},
		{"addr", "add", nodeIP + "/24", "dev", bridgeName},
		{"addr", "add", n.clusterIP + "/32", "dev", bridgeName},
		{"link", "set", "dev", bridgeName, "up"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	u, err := url.Parse(n.server)
	if err != nil {
		return fmt.Errorf("apiserver address %q: %w", n.server, err)
	}
	l, err := listenWhenAddressIsUp(net.JoinHostPort(n.clusterIP, "443"))
	if err != nil {
		return err
	}
	n.relay = l
	go relay(l, u.Host)
	return nil
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// listenWhenAddressIsUp binds addr, retrying while the address is still tentative.
func listenWhenAddressIsUp(addr string) (net.Listener, error) {
	var err error
	for i := 0; i < 50; i++ {
		var l net.Listener
		if l, err = net.Listen("tcp", addr); err == nil {
			return l, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("listen on %s: %w", addr, err)
}

// relay forwards every connection accepted on l to target (a loopback address), byte for byte.
func relay(l net.Listener, target string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				fmt.Fprintf(os.Stderr, "testenv-node: relay to %s: %v\n", target, err)
				return
			}
			defer up.Close()
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(up, c); closeWrite(up) }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, up); closeWrite(c) }()
			wg.Wait()
		}()
	}
}

func closeWrite(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		_ = t.CloseWrite()
	}
}
