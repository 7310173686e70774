package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// nodeState is what a node must undo; it is kept in stateDir so that the next node undoes it when
// this one was killed before it could (SIGKILL of the test process, a crash).
type nodeState struct {
	Dir         string            `json:"dir"`
	Keep        bool              `json:"keep"`
	Sysctls     map[string]string `json:"sysctls"`
	NetnsBefore []string          `json:"netns_before"`
	Created     []string          `json:"created"`
	// The cgroup (pids hierarchy) this process was in before it moved into the node's.
	PidsCgroupBefore string `json:"pids_cgroup_before"`
}

func statePath() string { return filepath.Join(stateDir, "state.json") }

func (s *nodeState) save() error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(statePath(), b, 0o600)
}

// sweepLeftovers removes everything a node made, using the state file; it does nothing when there
// is none. Order: processes (every PID in the node's cgroups), mounts, network namespaces, the
// bridge, cgroups, kernel settings, host paths, the directory.
func sweepLeftovers() error {
	b, err := os.ReadFile(statePath())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var s nodeState
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%s: %w", statePath(), err)
	}
	var problems []string
	if s.PidsCgroupBefore != "" {
		// Leave the node's cgroups, so they can be removed.
		_ = os.WriteFile(filepath.Join(cgroupMount, "pids", s.PidsCgroupBefore, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644)
	}
	if err := killCgroupProcesses(); err != nil {
		problems = append(problems, err.Error())
	}
	before := map[string]bool{}
	for _, name := range s.NetnsBefore {
		before[name] = true
	}
	for _, name := range listDir(netnsDir) {
		if strings.HasPrefix(name, "cni-") && !before[name] {
			p := filepath.Join(netnsDir, name)
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
			if err := os.Remove(p); err != nil {
				problems = append(problems, err.Error())
			}
		}
	}
	if s.Dir != "" {
		if err := unmountUnder(s.Dir); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if _, err := os.Stat("/sys/class/net/" + bridgeName); err == nil {
		if err := ip("link", "del", bridgeName); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if err := removeCgroups(); err != nil {
		problems = append(problems, err.Error())
	}
	for k, v := range s.Sysctls {
		p := filepath.Join("/proc/sys", k)
		if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) != v {
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				problems = append(problems, fmt.Sprintf("restore %s=%s: %v", k, v, err))
			}
		}
	}
	// Host paths that were not there before the node: remove them (deepest first) if empty of
	// anything but what kubelet and containerd put there.
	created := append([]string(nil), s.Created...)
	sort.Slice(created, func(i, j int) bool { return len(created[i]) > len(created[j]) })
	for _, p := range created {
		if err := os.RemoveAll(p); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if s.Dir != "" && !s.Keep {
		if mounted(s.Dir) {
			problems = append(problems, fmt.Sprintf("%s still has mounts; left in place", s.Dir))
		} else if err := os.RemoveAll(s.Dir); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return os.Remove(statePath())
}

// mountsUnder lists the mount points at or under dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

func mounted(dir string) bool { return len(mountsUnder(dir)) > 0 }

func unmountUnder(dir string) error {
	for i := 0; i < 5; i++ {
		mps := mountsUnder(dir)
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if mps := mountsUnder(dir); len(mps) > 0 {
		return fmt.Errorf("could not unmount %s", strings.Join(mps, ", "))
	}
	return nil
}
