package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// The hidden first arguments with which this binary runs as one of the node's Kubernetes parts,
// each in a child process of its own (their process-global state allows one per process).
const (
	kubeletRole   = "__kubelet"
	kcmRole       = "__kube-controller-manager"
	schedulerRole = "__kube-scheduler"
)

// runRole runs a Kubernetes part when args[0] names one; ok is false otherwise.
func runRole(args []string) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case kubeletRole:
		cmd := kubelet.NewKubeletCommand(context.Background())
		cmd.SetArgs(args[1:])
		return cli.Run(cmd), true
	case kcmRole:
		cmd := kcm.NewControllerManagerCommand()
		cmd.SetArgs(args[1:])
		return cli.Run(cmd), true
	case schedulerRole:
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args[1:])
		return cli.Run(cmd), true
	}
	return 0, false
}

var _ = os.Exit
