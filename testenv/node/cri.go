package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	remote "k8s.io/cri-client/pkg"
)

// removeSandboxes stops and removes every Pod sandbox through containerd's CRI, as the kubelet
// would: the CNI plugin is called to tear each Pod's network down (veth, address), and the
// sandbox's network namespace goes.
func removeSandboxes(socket string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	svc, err := remote.NewRemoteRuntimeService(ctx, "unix://"+socket, 10*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv-node: connect to containerd's CRI: %v\n", err)
		return
	}
	sandboxes, err := svc.ListPodSandbox(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv-node: list Pod sandboxes: %v\n", err)
		return
	}
	for _, sb := range sandboxes {
		if err := svc.StopPodSandbox(ctx, sb.Id); err != nil {
			fmt.Fprintf(os.Stderr, "testenv-node: stop sandbox %s: %v\n", sb.Id, err)
		}
		if err := svc.RemovePodSandbox(ctx, sb.Id); err != nil {
			fmt.Fprintf(os.Stderr, "testenv-node: remove sandbox %s: %v\n", sb.Id, err)
		}
	}
}
