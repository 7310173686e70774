package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const cgroupMount = "/sys/fs/cgroup"

// v1Hierarchies lists the cgroup v1 hierarchies mounted under /sys/fs/cgroup (cpu, memory, pids,
// name=systemd, ...), by directory; the unified (v2) mount of a hybrid setup is left out.
func v1Hierarchies() []string {
	var out []string
	for _, name := range listDir(cgroupMount) {
		p := filepath.Join(cgroupMount, name)
		if name == "unified" {
			continue
		}
		if fi, err := os.Lstat(p); err != nil || fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
			continue // cpu,cpuacct style links
		}
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// setupCgroups makes the kubelet's cgroup root in every hierarchy and moves this process (and so
// every process it starts) into /wcm-node/runtime of the pids hierarchy.
func setupCgroups(s *nodeState) error {
	for _, h := range v1Hierarchies() {
		root := filepath.Join(h, cgroupName)
		if err := os.MkdirAll(root, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", root, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(root, f), v, 0o644); err != nil {
					return fmt.Errorf("set %s of %s: %w", f, root, err)
				}
			}
		}
	}
	s.PidsCgroupBefore = ownCgroup("pids")
	if err := s.save(); err != nil {
		return err
	}
	runtime := filepath.Join(cgroupMount, "pids", cgroupName, "runtime")
	if err := os.MkdirAll(runtime, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(runtime, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// ownCgroup is this process's cgroup path in a v1 controller's hierarchy.
func ownCgroup(controller string) string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "/"
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == controller {
				return f[2]
			}
		}
	}
	return "/"
}

// nodePIDs lists every process in the node's pids cgroup tree except this one.
func nodePIDs() []int {
	var pids []int
	self := os.Getpid()
	_ = filepath.Walk(filepath.Join(cgroupMount, "pids", cgroupName), func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || info.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != self {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// killCgroupProcesses SIGKILLs every process of the node by its PID until none is left.
func killCgroupProcesses() error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		pids := nodePIDs()
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still in the node's cgroups: %v", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeCgroups removes the node's cgroups in every hierarchy, deepest first.
func removeCgroups() error {
	var problems []string
	for _, h := range v1Hierarchies() {
		root := filepath.Join(h, cgroupName)
		var dirs []string
		_ = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for i := 0; i < 20; i++ {
				if err = syscall.Rmdir(d); err == nil || os.IsNotExist(err) {
					err = nil
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("rmdir %s: %v", d, err))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}
