package main

// containerd 1.6 (config version 2): everything under the node's directory; the CRI plugin with
// runc on cgroupfs, the node's own CNI configuration, and the locally built sandbox image.
// restrict_oom_score_adj: root on these machines lacks CAP_SYS_RESOURCE, so runc cannot set the
// -998 OOM score the kubelet asks for ("can't get final child's PID from pipe: EOF") without it.
const containerdConfig = `version = 2
root = "%s/containerd/root"
state = "%s/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "%s"

[ttrpc]
  address = "%s.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%s"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%s"
    conf_dir = "%s"
    max_conf_num = 1
`

// The CNI bridge: no gateway role and no masquerade, so the host does not route for the Pods
// (ip_forward stays 0) and a Pod reaches only the bridge's subnet, the node's address and the
// kubernetes Service's ClusterIP, which the node holds on the bridge (relayed to the apiserver).
const cniConfig = `{
  "cniVersion": "0.4.0",
  "name": "wcm-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "%s",
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "%s", "rangeStart": "10.244.0.10", "gateway": "%s"}]],
        "routes": [{"dst": "%s/32", "gw": "%s"}],
        "dataDir": "%s"
      }
    }
  ]
}
`

// kubelet: cgroup v1 allowed (1.35+ refuses it otherwise), cgroupfs under a root of the node's
// own, no iptables chains in the host (makeIPTablesUtilChains would add KUBE-FIREWALL DROP rules),
// ConfigMap volumes refreshed every 10 s, no image garbage collection or disk evictions (the test
// images cannot be pulled again), and its API on the bridge address only, with webhook
// authentication and authorization against the apiserver.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
authorization:
  mode: Webhook
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://%s
resolvConf: %s
podLogsDir: %s
syncFrequency: 10s
nodeStatusUpdateFrequency: 2s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 240h
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
maxPods: 30
serializeImagePulls: false
shutdownGracePeriod: 0s
`
