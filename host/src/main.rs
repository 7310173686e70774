use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use wasm_controller_manager::app::{self, RunConfig};
use wasm_controller_manager::cluster::election::LeaderMode;
use wasm_controller_manager::cluster::identity::IdentitySettings;
use wasm_controller_manager::cluster::leader::LeaderSettings;
use wasm_controller_manager::cluster::services::BudgetSettings;
use wasm_controller_manager::engine::rate_limit::RateLimits;
use wasm_controller_manager::loading::settings::ControllerSelection;
use wasm_controller_manager::sandbox::tape::RecordWhat;
use wasm_controller_manager::sandbox::{Limits, MemoryReset};

/// A Kubernetes controller manager whose reconcilers are sandboxed WebAssembly components.
#[derive(Parser)]
#[command(name = "wasm-controller-manager", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "info,wasm_controller_manager=debug".
    #[arg(long, env = "WCM_LOG", default_value = "info", global = true)]
    log: String,
    /// Log format: text, or json (one JSON object per line).
    #[arg(long, env = "WCM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// Same as --log-format json.
    #[arg(long, global = true, hide = true)]
    log_json: bool,
    /// Plugins are compiled in a short-lived child process of this binary, one at a time, so the
    /// compile's memory is given back when it exits; a compile whose peak RSS passes this many
    /// MiB is stopped, and that plugin fails with the reason. The child's data segment is also
    /// limited to twice this (RLIMIT_DATA), and it is the kernel's first choice should memory run
    /// out (oom_score_adj 1000).
    #[arg(
        long,
        env = "WCM_MAX_COMPILE_MEMORY_MB",
        global = true,
        default_value_t = wasm_controller_manager::sandbox::compiler::DEFAULT_MAX_COMPILE_MEMORY_MB
    )]
    max_compile_memory_mb: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `push`.
#[derive(clap::Args)]
struct PushArgs {
    /// The plugin component (.wasm).
    plugin: PathBuf,
    /// Where: REGISTRY/REPOSITORY:TAG (e.g. registry.example.com/team/network:1.4.0).
    target: String,
    /// Registry user; the password comes from --password-stdin or WCM_REGISTRY_PASSWORD.
    #[arg(long)]
    username: Option<String>,
    /// Read the password from standard input (one line).
    #[arg(long, requires = "username")]
    password_stdin: bool,
    /// Credentials from a docker config (`~/.docker/config.json`, or a Secret's .dockerconfigjson),
    /// for the target's registry.
    #[arg(long)]
    docker_config: Option<PathBuf>,
    /// PEM file of CA certificates trusted for the registry besides the system's.
    #[arg(long)]
    registry_ca: Option<PathBuf>,
    /// Reach the registry over plain HTTP (a registry on loopback or a local mirror only).
    #[arg(long)]
    plain_http: bool,
    /// Largest component accepted, in bytes (as `run --max-plugin-bytes`).
    #[arg(long, default_value_t = 64 << 20)]
    max_plugin_bytes: u64,
    /// Print a Plugin object of this name naming the pushed artifact (for `kubectl apply -f -`),
    /// instead of the reference.
    #[arg(long = "plugin", visible_alias = "plugin-name", value_name = "NAME")]
    plugin_name: Option<String>,
    /// With --plugin: the pull Secret (kubernetes.io/dockerconfigjson) the Plugin names.
    #[arg(long, requires = "plugin_name", value_name = "SECRET")]
    pull_secret: Option<String>,
}

impl PushArgs {
    async fn run(self) -> anyhow::Result<String> {
        use wasm_controller_manager::loading::objects::{fetch, push};
        let registry = self
            .target
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let credentials = match (&self.username, &self.docker_config) {
            (Some(_), Some(_)) => anyhow::bail!("--username and --docker-config: give one"),
            (Some(user), None) => {
                let password = if self.password_stdin {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line)?;
                    line.trim_end_matches(['\r', '\n']).to_string()
                } else {
                    std::env::var("WCM_REGISTRY_PASSWORD").map_err(|_| {
                        anyhow::anyhow!(
                            "--username needs --password-stdin or WCM_REGISTRY_PASSWORD"
                        )
                    })?
                };
                Some(fetch::Credentials {
                    username: user.clone(),
                    password,
                })
            }
            (None, Some(path)) => {
                let text = std::fs::read(path)
                    .map_err(|e| anyhow::anyhow!("--docker-config {}: {e}", path.display()))?;
                let found = fetch::credentials_for(&text, &registry)
                    .map_err(|e| anyhow::anyhow!("--docker-config {}: {e}", path.display()))?;
                Some(found.ok_or_else(|| {
                    anyhow::anyhow!(
                        "--docker-config {}: no entry for {registry}",
                        path.display()
                    )
                })?)
            }
            (None, None) => None,
        };
        if let Some(name) = &self.plugin_name {
            wasm_controller_manager::contract::validate::namespace(name)
                .map_err(|e| anyhow::anyhow!("--plugin: {e}"))?;
        }
        if let Some(secret) = &self.pull_secret {
            wasm_controller_manager::contract::validate::name(secret)
                .map_err(|e| anyhow::anyhow!("--pull-secret: {e}"))?;
        }
        let ca_pem = match &self.registry_ca {
            Some(p) => Some(
                std::fs::read(p)
                    .map_err(|e| anyhow::anyhow!("--registry-ca {}: {e}", p.display()))?,
            ),
            None => None,
        };
        let pushed = push::push(push::PushRequest {
            file: &self.plugin,
            target: &self.target,
            credentials,
            ca_pem,
            plain_http: self.plain_http,
            max_bytes: usize::try_from(self.max_plugin_bytes).unwrap_or(usize::MAX),
        })
        .await?;
        Ok(match &self.plugin_name {
            Some(name) => push::plugin_yaml(name, &pushed.reference, self.pull_secret.as_deref()),
            None => format!("{}\n", pushed.reference),
        })
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the manager: load every plugin in --plugins-dir and reconcile until SIGTERM.
    Run(Box<RunArgs>),
    /// Print what a plugin declares, its imports and exports, its size and compile time.
    Inspect {
        /// The plugin component (.wasm).
        plugin: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the RBAC (YAML) that grants each plugin exactly what it declares, and the host what
    /// it needs to act for them: ServiceAccounts, Roles/ClusterRoles and bindings to review and
    /// apply (`kubectl apply -f -`, or a kustomize resource). Each plugin's NAME.toml beside it is
    /// read too (its name, config and Secrets).
    Rbac(RbacArgs),
    /// Run a plugin against a reconcile recorded with `run --record-dir`, with no cluster and no
    /// network: every host call is answered from the recording. Prints the calls, the result and
    /// what differs from the recording; exits 1 when anything differs (a regression test).
    Replay {
        /// The recording (a JSON file under --record-dir/PLUGIN/).
        recording: PathBuf,
        /// The plugin component (.wasm): the recorded build, or a newer one to check.
        plugin: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Cache of compiled plugins (as `run --compile-cache`).
        #[arg(long, env = "WCM_COMPILE_CACHE")]
        compile_cache: Option<PathBuf>,
    },
    /// Push a built plugin to an OCI registry in the CNCF wasm artifact layout and print the
    /// reference pinned by digest (or, with --plugin NAME, a Plugin object naming it) for
    /// `kubectl apply -f -`.
    Push(Box<PushArgs>),
    /// Print the version and the plugin contract (WIT) versions this host serves.
    Version,
    /// The compile child: reads a component on stdin, writes its artifact (internal).
    #[command(name = "compile-worker", hide = true)]
    CompileWorker {
        #[arg(long)]
        artifact: PathBuf,
        /// The host engine's key; without it no check (measurements only).
        #[arg(long)]
        engine_key: Option<String>,
        /// wasmtime's parallel compilation (off: a lower peak, and the child leaves the other
        /// cores to the running plugins; docs/decisions.md).
        #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
        parallel_compilation: bool,
        /// Cranelift's level (none, speed, speed-and-size), for measurements only.
        #[arg(long)]
        opt_level: Option<String>,
        /// Cranelift's register allocator (backtracking, single-pass), for measurements only.
        #[arg(long)]
        regalloc: Option<String>,
    },
}

/// Where the plugins' identities live (the same for `run` and `rbac`).
#[derive(Args)]
struct IdentityArgs {
    /// Namespace of the plugins' ServiceAccounts: each plugin acts as its own ServiceAccount
    /// (impersonated), so the API server's RBAC decides what it may do.
    #[arg(
        long,
        env = "WCM_PLUGIN_IDENTITY_NAMESPACE",
        default_value = "wcm-system"
    )]
    plugin_identity_namespace: String,
    /// Prefix of a plugin's ServiceAccount name (the plugin's name follows it).
    #[arg(
        long,
        env = "WCM_PLUGIN_IDENTITY_PREFIX",
        default_value = "wcm-plugin-"
    )]
    plugin_identity_prefix: String,
    /// A namespace no plugin acts in unless its NAME.toml names it in `namespaces` (repeat the
    /// flag for more). Always protected as well: --plugin-identity-namespace and the host's own
    /// namespace (in a cluster: POD_NAMESPACE or its ServiceAccount's; for `rbac`: the namespace of
    /// --host-service-account).
    #[arg(
        long = "protected-namespace",
        env = "WCM_PROTECTED_NAMESPACES",
        value_delimiter = ','
    )]
    protected_namespaces: Vec<String>,
}

impl IdentityArgs {
    fn settings(self) -> anyhow::Result<IdentitySettings> {
        use wasm_controller_manager::contract::validate;
        validate::namespace(&self.plugin_identity_namespace)
            .map_err(|e| anyhow::anyhow!("--plugin-identity-namespace: {e}"))?;
        // A plugin's ServiceAccount is PREFIX + its name: without a prefix a plugin could take the
        // name (and so the identity) of any ServiceAccount there, the host's own included.
        anyhow::ensure!(
            !self.plugin_identity_prefix.is_empty(),
            "--plugin-identity-prefix must not be empty: plugins' ServiceAccounts would be named after the plugins alone"
        );
        for ns in &self.protected_namespaces {
            validate::namespace(ns).map_err(|e| anyhow::anyhow!("--protected-namespace: {e}"))?;
        }
        Ok(IdentitySettings {
            namespace: self.plugin_identity_namespace,
            prefix: self.plugin_identity_prefix,
            protected: self.protected_namespaces,
        })
    }
}

/// The namespace this process runs in, when it runs in a cluster (POD_NAMESPACE, or its
/// ServiceAccount's).
fn own_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[derive(Args)]
struct RbacArgs {
    /// Plugin components (.wasm).
    #[arg(required = true)]
    plugins: Vec<PathBuf>,
    /// Resolve watched kinds through this cluster's discovery (exact resources and scopes);
    /// without it kinds are pluralised, and a note says so.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    identity: IdentityArgs,
    /// The host's ServiceAccount as NAMESPACE/NAME, to print what it needs (watching, impersonating);
    /// "none" prints only the plugins' objects.
    #[arg(long, default_value = "wcm-system/wasm-controller-manager")]
    host_service_account: String,
    /// Apply the objects to the cluster of --kubeconfig (server-side apply) instead of printing
    /// them: for a local cluster; review the YAML before applying it to a shared one.
    #[arg(long, requires = "kubeconfig")]
    apply: bool,
    /// Cache of compiled plugins (as `run --compile-cache`).
    #[arg(long, env = "WCM_COMPILE_CACHE")]
    compile_cache: Option<PathBuf>,
    /// Grant plugin PLUGIN (by name; repeat for more), which acts in every namespace (it watches
    /// a kind in all of them and its NAME.toml names no `namespaces`), its declared rights and
    /// events cluster-wide, protected namespaces included: RBAC cannot leave one out, so there
    /// only the host's own fence stands. Without it such a plugin is refused with what to set.
    #[arg(long = "all-namespaces", value_name = "PLUGIN")]
    all_namespaces: Vec<String>,
    /// Print the rights of plugin PLUGIN (repeat for more) that lead to others' (wildcards,
    /// escalate, bind, impersonate, tokens, exec, nodes/proxy, admission webhooks, CSRs, CRDs,
    /// APIServices, RBAC objects, API priority, Secrets created or read everywhere, volumes,
    /// workloads and their configuration written in every namespace) with a warning naming the
    /// risk, instead of refusing them.
    #[arg(long = "allow-risky", value_name = "PLUGIN")]
    allow_risky: Vec<String>,
}

impl RbacArgs {
    async fn run(self) -> anyhow::Result<String> {
        use wasm_controller_manager::cluster::rbac::Allow;
        use wasm_controller_manager::contract::validate;
        use wasm_controller_manager::loading::rbac::{RbacRequest, generate, render};
        let identity = self.identity.settings()?;
        let host_service_account = match self.host_service_account.as_str() {
            "none" => None,
            s => {
                let (ns, name) = s.split_once('/').ok_or_else(|| {
                    anyhow::anyhow!("--host-service-account {s:?} is not NAMESPACE/NAME")
                })?;
                validate::namespace(ns)
                    .and_then(|_| validate::name(name))
                    .map_err(|e| anyhow::anyhow!("--host-service-account: {e}"))?;
                Some((ns.to_string(), name.to_string()))
            }
        };
        let req = RbacRequest {
            compile_cache: self.compile_cache,
            plugins: self.plugins,
            identity,
            host_service_account,
            allow: wasm_controller_manager::cluster::rbac::Allowances {
                all_namespaces: Allow::plugins(self.all_namespaces),
                risky: Allow::plugins(self.allow_risky),
            },
        };
        let Some(path) = &self.kubeconfig else {
            return render(&generate(&req, None).await?, None);
        };
        let config = app::kube_config(Some(path)).await?;
        let client = kube::Client::try_from(config)?;
        let discovery = wasm_controller_manager::cluster::discovery::Discovery::new(
            client.clone(),
            Duration::from_secs(30),
        );
        let out = generate(&req, Some(&discovery)).await?;
        if self.apply {
            wasm_controller_manager::loading::rbac::apply(&client, &out.objects).await?;
            return Ok(format!("applied {} objects\n", out.objects.len()));
        }
        let existing = wasm_controller_manager::loading::rbac::existing_namespaces(&client).await?;
        render(&out, Some(&existing))
    }
}

#[derive(Args)]
struct RunArgs {
    /// Kubeconfig file; default: KUBECONFIG, ~/.kube/config, or the in-cluster service account.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Directory of plugins: each NAME.wasm, with an optional NAME.toml. Watched for changes.
    #[arg(long, env = "WCM_PLUGINS_DIR")]
    plugins_dir: PathBuf,
    /// Directory for precompiled plugins (keyed by content and engine); none: compile at every start.
    #[arg(long, env = "WCM_COMPILE_CACHE")]
    compile_cache: Option<PathBuf>,
    /// Bound of --compile-cache, MiB: past it, the oldest artifacts of components no plugin names
    /// now are removed (those of running plugins never are).
    #[arg(long, env = "WCM_COMPILE_CACHE_MAX_MB", default_value_t = 192)]
    compile_cache_max_mb: u64,
    /// Address for /metrics, /plugins and /debug/controllers (and /healthz, /readyz); "off"
    /// disables it.
    #[arg(long, env = "WCM_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: String,
    /// A separate address for /healthz and /readyz only (the kubelet's probes), e.g.
    /// 0.0.0.0:8081; "off" (the default): they are served on --metrics-addr alone.
    #[arg(long, env = "WCM_HEALTH_ADDR", default_value = "off")]
    health_addr: String,
    /// Client-side limit on API requests per second, for all plugins together.
    #[arg(
        long = "kube-api-qps",
        alias = "kube-qps",
        env = "WCM_KUBE_API_QPS",
        default_value_t = 50.0
    )]
    kube_qps: f64,
    /// Burst above --kube-api-qps.
    #[arg(
        long = "kube-api-burst",
        alias = "kube-burst",
        env = "WCM_KUBE_API_BURST",
        default_value_t = 100
    )]
    kube_burst: u32,
    /// Timeout of one API request (and of one event write) made for a plugin, seconds. With
    /// --leader-elect a write is cut earlier if this replica's hold on the Lease ends (no renewal
    /// within the renew deadline), and a Lease is released only once its writes have ended.
    #[arg(long, env = "WCM_API_TIMEOUT_SECONDS", default_value_t = 30)]
    api_timeout_seconds: u64,
    /// Workers of a plugin that declares none and has no `workers` in its NAME.toml.
    #[arg(
        long = "concurrent-syncs",
        alias = "default-workers",
        env = "WCM_CONCURRENT_SYNCS",
        default_value_t = 1
    )]
    default_workers: u32,
    /// Guest CPU time per call, milliseconds (NAME.toml: cpu_deadline_ms).
    #[arg(long, env = "WCM_CPU_DEADLINE_MS", default_value_t = 1000)]
    cpu_deadline_ms: u64,
    /// Linear memory per plugin instance, MiB (NAME.toml: memory_mb).
    #[arg(long, env = "WCM_MEMORY_MB", default_value_t = 64)]
    memory_mb: u32,
    /// Component instances alive at once across all plugins (the instance pool). Two are kept
    /// for describing new files, one for each loaded plugin (its first instance), and the rest
    /// are shared, each plugin taking at most --max-instances-per-plugin; at most this minus 2
    /// plugins run at once (the others wait, reason instance_pool). A plugin component may hold
    /// at most 32 core instances, 2 memories and 16 tables.
    #[arg(long, env = "WCM_MAX_INSTANCES", default_value_t = 128)]
    max_instances: u32,
    /// Largest plugin file accepted, bytes.
    #[arg(long, env = "WCM_MAX_PLUGIN_BYTES", default_value_t = 64 << 20)]
    max_plugin_bytes: u64,
    /// Rescan the plugins directory this often, seconds, besides reacting to file events.
    #[arg(long, env = "WCM_RESCAN_SECONDS", default_value_t = 30)]
    rescan_seconds: u64,
    /// Hosts (host or host:port) any plugin may reach over HTTP, if it declares them; repeatable.
    #[arg(long = "allow-host", env = "WCM_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Also load the cluster's Plugin objects (plugins.wcm.dev, manifests/crds/), each pulled from
    /// a registry by digest and loaded like a file of --plugins-dir.
    #[arg(long, env = "WCM_PLUGIN_OBJECTS")]
    plugin_objects: bool,
    /// Registries (host or host:port) a Plugin object's component may come from, and https hosts
    /// for an `https` source; repeatable. A source elsewhere is refused on the object's status.
    #[arg(
        long = "plugin-registry",
        env = "WCM_PLUGIN_REGISTRIES",
        value_delimiter = ','
    )]
    plugin_registries: Vec<String>,
    /// PEM file of CA certificates trusted for the registries besides the system's.
    #[arg(long, env = "WCM_PLUGIN_REGISTRY_CA")]
    plugin_registry_ca: Option<PathBuf>,
    /// Registries of --plugin-registry reached over plain HTTP (a local mirror; never across a
    /// network you do not control); repeatable.
    #[arg(
        long = "plugin-registry-plain-http",
        env = "WCM_PLUGIN_REGISTRY_PLAIN_HTTP",
        value_delimiter = ','
    )]
    plugin_registry_plain_http: Vec<String>,
    /// Directory that keeps fetched components by digest, so a restart while a registry is down
    /// runs what it holds (each file is checked against its digest when read); none: memory only.
    #[arg(long, env = "WCM_PLUGIN_CACHE")]
    plugin_cache: Option<PathBuf>,
    /// Hosts (host or host:port) a Plugin object's settings may list in `allowed_hosts`;
    /// repeatable. Whoever writes a Plugin may give it only these (files in --plugins-dir are the
    /// operator's and are not bound by this list).
    #[arg(
        long = "plugin-object-host",
        env = "WCM_PLUGIN_OBJECT_HOSTS",
        value_delimiter = ','
    )]
    plugin_object_hosts: Vec<String>,
    /// PEM files of cosign public keys (ECDSA P-256); repeatable. With any, every Plugin's
    /// artifact must carry a cosign signature by one of them, besides the Plugin's own
    /// `verify.publicKeys` (checked offline; docs/deploying.md).
    #[arg(
        long = "plugin-verify-key",
        env = "WCM_PLUGIN_VERIFY_KEYS",
        value_delimiter = ','
    )]
    plugin_verify_keys: Vec<PathBuf>,
    /// Memory for the components of all Plugin objects together, MiB (each also within
    /// --max-plugin-bytes); a Plugin past it waits, reported on its status, until room is made.
    #[arg(long, env = "WCM_PLUGIN_OBJECTS_MAX_TOTAL_MB", default_value_t = 512)]
    plugin_objects_max_total_mb: u64,
    /// First retry delay of a failing key, milliseconds (doubles per failure).
    #[arg(long, env = "WCM_RETRY_BASE_MS", default_value_t = 5)]
    retry_base_ms: u64,
    /// Largest retry delay of a failing key, seconds.
    #[arg(long, env = "WCM_RETRY_MAX_SECONDS", default_value_t = 1000)]
    retry_max_seconds: u64,
    /// Event writes per second to the API server, all plugins together.
    #[arg(long, env = "WCM_EVENT_QPS", default_value_t = 20.0)]
    event_qps: f64,
    /// Burst above --event-qps.
    #[arg(long, env = "WCM_EVENT_BURST", default_value_t = 50)]
    event_burst: u32,
    #[command(flatten)]
    identity: IdentityArgs,
    /// API requests per second of one plugin, before the host-wide --kube-qps (NAME.toml: api_qps).
    #[arg(long, env = "WCM_PLUGIN_API_QPS", default_value_t = 20.0)]
    plugin_api_qps: f64,
    /// Burst above --plugin-api-qps (NAME.toml: api_burst).
    #[arg(long, env = "WCM_PLUGIN_API_BURST", default_value_t = 40)]
    plugin_api_burst: u32,
    /// Outbound HTTP requests per second of one plugin, over all its workers (NAME.toml:
    /// http_qps; 0: no limit). A request over it waits for its turn, or is refused at once when
    /// its turn would come after the call's wall timeout.
    #[arg(long, env = "WCM_PLUGIN_HTTP_QPS", default_value_t = 20.0)]
    plugin_http_qps: f64,
    /// Burst above --plugin-http-qps (NAME.toml: http_burst).
    #[arg(long, env = "WCM_PLUGIN_HTTP_BURST", default_value_t = 40)]
    plugin_http_burst: u32,
    /// The shortest requeue-after a plugin gets, milliseconds: a shorter one waits this long and
    /// takes a token of --retry-qps (NAME.toml: min_requeue_after_ms; 0: none).
    #[arg(long, env = "WCM_MIN_REQUEUE_AFTER_MS", default_value_t = 1000)]
    min_requeue_after_ms: u64,
    /// Log lines per second of one plugin (its own and the host's about it); the rest are dropped
    /// and counted.
    #[arg(long, env = "WCM_PLUGIN_LOG_LINES_PER_SECOND", default_value_t = 50.0)]
    plugin_log_lines_per_second: f64,
    /// Cores of guest CPU one plugin may use on average, charged as its calls run; a plugin over
    /// it is paused within its running calls and waits before its next one (NAME.toml:
    /// cpu_share; 0: no limit).
    #[arg(long, env = "WCM_PLUGIN_CPU_SHARE", default_value_t = 0.25)]
    plugin_cpu_share: f64,
    /// Most workers any plugin gets, whatever it or its NAME.toml asks for.
    #[arg(long, env = "WCM_MAX_WORKERS_PER_PLUGIN", default_value_t = 16)]
    max_workers_per_plugin: u32,
    /// Record reconciles to this directory (DIR/PLUGIN/*.json, the newest 20 of each plugin; private
    /// to this user: recordings hold the objects a plugin saw, never secret values), for
    /// `wasm-controller-manager replay`.
    #[arg(long, env = "WCM_RECORD_DIR")]
    record_dir: Option<PathBuf>,
    /// Which reconciles --record-dir records: "failures" (errors and failed calls) or "all".
    #[arg(long, env = "WCM_RECORD", value_enum, default_value_t = RecordWhat::Failures)]
    record: RecordWhat,
    /// Send a trace of each reconcile (a span per reconcile with a child span per host call: API
    /// verb and resource, cache read, event, outbound HTTP) to this OpenTelemetry collector, over
    /// OTLP/HTTP (protobuf) at URL/v1/traces, e.g. http://otel-collector:4318. Off when unset.
    #[arg(long, env = "WCM_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// The `service.name` of the traces.
    #[arg(
        long,
        env = "WCM_OTLP_SERVICE_NAME",
        default_value = "wasm-controller-manager"
    )]
    otlp_service_name: String,
    /// The share of reconciles traced, 0 to 1 (decided per trace).
    #[arg(long, env = "WCM_OTLP_SAMPLE_RATIO", default_value_t = 1.0)]
    otlp_sample_ratio: f64,
    /// How an instance's linear memory is reset for the next one: "auto" resets only the pages it
    /// wrote (Linux ≥ 6.7, and only where no page can be swapped out, else as "memset");
    /// "memset" writes back the first 2 MiB whole.
    #[arg(long, env = "WCM_MEMORY_RESET", value_enum, default_value_t = MemoryReset::Auto)]
    memory_reset: MemoryReset,
    /// Most instances of one plugin alive at once, warm ones included (NAME.toml: max_instances):
    /// its own slot of --max-instances, then shared ones while any is free.
    #[arg(long, env = "WCM_MAX_INSTANCES_PER_PLUGIN", default_value_t = 16)]
    max_instances_per_plugin: u32,
    /// Most list+watch streams one plugin may need: its distinct (kind, namespace, label
    /// selector, metadata-only) watches, selectors compared in canonical form; streams shared
    /// with other plugins count too. A plugin that needs more is refused and opens none
    /// (NAME.toml: max_watch_streams).
    #[arg(long, env = "WCM_MAX_WATCH_STREAMS_PER_PLUGIN", default_value_t = 8)]
    max_watch_streams_per_plugin: u32,
    /// Most series of one plugin's own metrics (contract 0.3), over all its metrics: an update
    /// that would make one more is refused and counted (NAME.toml: max_metric_series).
    #[arg(long, env = "WCM_PLUGIN_METRIC_SERIES", default_value_t = 1000)]
    plugin_metric_series: u32,
    /// How often a waiting plugin (missing grant, kind not served yet, ...) is tried again, seconds.
    #[arg(long, env = "WCM_WAIT_RETRY_SECONDS", default_value_t = 5)]
    wait_retry_seconds: u64,
    /// Wall time a plugin's `describe` may take, sleeping included, seconds (at most the wall
    /// timeout). A plugin whose `describe` takes longer is refused until its file changes; other
    /// files load meanwhile.
    #[arg(long, env = "WCM_DESCRIBE_TIMEOUT_SECONDS", default_value_t = 10)]
    describe_timeout_seconds: u64,
    /// How long a plugin's caches may take to list before it waits and is tried again, seconds.
    #[arg(long, env = "WCM_CACHE_SYNC_TIMEOUT_SECONDS", default_value_t = 60)]
    cache_sync_timeout_seconds: u64,
    /// Retries per second over all keys of a plugin (token bucket).
    #[arg(long, env = "WCM_RETRY_QPS", default_value_t = 10.0)]
    retry_qps: f64,
    /// Burst above --retry-qps.
    #[arg(long, env = "WCM_RETRY_BURST", default_value_t = 100)]
    retry_burst: u32,
    /// Plugins to run, by name, as kube-controller-manager's --controllers: "*" runs every plugin,
    /// "foo" runs foo, "-foo" does not. Plugins left out show as disabled in /plugins.
    #[arg(
        long,
        env = "WCM_CONTROLLERS",
        value_delimiter = ',',
        default_value = "*"
    )]
    controllers: Vec<String>,
    #[command(flatten)]
    leader: LeaderArgs,
    /// On SIGTERM/SIGINT, how long in-flight reconciles may take to finish before the process
    /// exits anyway (the Lease is released after them).
    #[arg(long, env = "WCM_SHUTDOWN_GRACE", default_value = "25s", value_parser = parse_duration)]
    shutdown_grace: Duration,
}

/// Leader election among replicas, with kube-controller-manager's flags.
#[derive(Args)]
struct LeaderArgs {
    /// Elect a leader on a Lease: only the leader reconciles, standbys keep their caches warm and
    /// take over when it goes. Needed with more than one replica.
    #[arg(long, env = "WCM_LEADER_ELECT", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// How long a standby waits after the leader's last renewal before taking over.
    #[arg(long, env = "WCM_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: Duration,
    /// How long the leader keeps reconciling without a successful renewal; below the lease
    /// duration, so it stops before a standby may start.
    #[arg(long, env = "WCM_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: Duration,
    /// How often the leader renews, and a standby tries to acquire.
    #[arg(long, env = "WCM_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: Duration,
    /// Name of the Lease.
    #[arg(
        long,
        env = "WCM_LEADER_ELECT_RESOURCE_NAME",
        default_value = "wasm-controller-manager"
    )]
    leader_elect_resource_name: String,
    /// "manager": one Lease, and its holder reconciles every plugin (kube-controller-manager's
    /// way). "per-plugin": one Lease per plugin (named LEASE-plugin-PLUGIN), so replicas share the
    /// plugins, each leading about its fair share and taking over a lost replica's plugins.
    #[arg(long, env = "WCM_LEADER_ELECT_MODE", value_enum, default_value_t = LeaderMode::Manager)]
    leader_elect_mode: LeaderMode,
    /// Namespace of the Lease; default: the Pod's own namespace in a cluster (POD_NAMESPACE or the
    /// ServiceAccount's), else wcm-system.
    #[arg(long, env = "WCM_LEADER_ELECT_RESOURCE_NAMESPACE")]
    leader_elect_resource_namespace: Option<String>,
}

impl LeaderArgs {
    fn settings(self) -> anyhow::Result<Option<LeaderSettings>> {
        use wasm_controller_manager::contract::validate;
        if !self.leader_elect {
            return Ok(None);
        }
        let namespace = match self.leader_elect_resource_namespace {
            Some(ns) => ns,
            None => own_namespace().unwrap_or_else(|| "wcm-system".into()),
        };
        validate::namespace(&namespace)
            .map_err(|e| anyhow::anyhow!("--leader-elect-resource-namespace: {e}"))?;
        validate::name(&self.leader_elect_resource_name)
            .map_err(|e| anyhow::anyhow!("--leader-elect-resource-name: {e}"))?;
        let settings = LeaderSettings {
            lease_name: self.leader_elect_resource_name,
            namespace,
            identity: leader_identity(),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        settings.check()?;
        Ok(Some(settings))
    }
}

/// Unique per process, readable in the Lease: the Pod (or host) name, then a random-enough
/// suffix, as client-go's `hostname_uuid`.
fn leader_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "wasm-controller-manager".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{host}_{:x}{nanos:08x}", std::process::id())
}

/// "15s", "2m", "500ms" or a plain number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 15s, 2m, 500ms)"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => n
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{s:?} is too long")),
        _ => Err(format!("{s:?}: unknown unit {unit:?} (use ms, s or m)")),
    }
}

/// An address flag: HOST:PORT, or "off".
fn listen_addr(flag: &str, value: &str) -> anyhow::Result<Option<SocketAddr>> {
    match value {
        "off" | "" => Ok(None),
        s => Ok(Some(s.parse::<SocketAddr>().map_err(|e| {
            anyhow::anyhow!("--{flag} {s:?}: {e} (expected IP:PORT, e.g. 0.0.0.0:8080, or off)")
        })?)),
    }
}

impl RunArgs {
    fn into_config(mut self) -> anyhow::Result<RunConfig> {
        let metrics_addr = listen_addr("metrics-addr", &self.metrics_addr)?;
        let health_addr = listen_addr("health-addr", &self.health_addr)?;
        if let (Some(m), Some(h)) = (metrics_addr, health_addr) {
            anyhow::ensure!(
                m != h || m.port() == 0,
                "--health-addr {h} is --metrics-addr too: give it another port, or leave it off"
            );
        }
        anyhow::ensure!(
            self.plugins_dir.is_dir(),
            "--plugins-dir {} is not a directory",
            self.plugins_dir.display()
        );
        anyhow::ensure!(self.memory_mb > 0, "--memory-mb must be at least 1");
        let mut identity = self.identity.settings()?;
        if let Some(ns) = own_namespace()
            && wasm_controller_manager::contract::validate::namespace(&ns).is_ok()
            && !identity.protected.contains(&ns)
        {
            identity.protected.push(ns);
        }
        anyhow::ensure!(
            self.plugin_http_qps.is_finite() && self.plugin_http_qps >= 0.0,
            "--plugin-http-qps must be a number of at least 0 (0: no limit)"
        );
        anyhow::ensure!(
            self.cpu_deadline_ms > 0,
            "--cpu-deadline-ms must be at least 1"
        );
        let leader_mode = self.leader.leader_elect_mode;
        let leader_election = self.leader.settings()?;
        // The Leases (the manager's, each plugin's, each replica's membership) are the host's too.
        if let Some(l) = &leader_election
            && !identity.protected.contains(&l.namespace)
        {
            identity.protected.push(l.namespace.clone());
        }
        let controllers = ControllerSelection::parse(&self.controllers)
            .map_err(|e| anyhow::anyhow!("--controllers: {e}"))?;
        let plugin_objects = if self.plugin_objects {
            let ca_pem =
                match &self.plugin_registry_ca {
                    Some(p) => Some(std::fs::read(p).map_err(|e| {
                        anyhow::anyhow!("--plugin-registry-ca {}: {e}", p.display())
                    })?),
                    None => None,
                };
            for r in self
                .plugin_registries
                .iter()
                .chain(&self.plugin_registry_plain_http)
                .chain(&self.plugin_object_hosts)
            {
                wasm_controller_manager::loading::objects::spec::check_authority(r)
                    .map_err(|e| anyhow::anyhow!("--plugin-registry/--plugin-object-host: {e}"))?;
            }
            let normal = wasm_controller_manager::loading::objects::spec::normal_authority;
            self.plugin_registries = self.plugin_registries.iter().map(|r| normal(r)).collect();
            for r in self.plugin_registry_plain_http.iter() {
                anyhow::ensure!(
                    self.plugin_registries.contains(r),
                    "--plugin-registry-plain-http {r} is not one of --plugin-registry"
                );
            }
            Some(wasm_controller_manager::loading::objects::ObjectSettings {
                registries: self.plugin_registries.iter().cloned().collect(),
                plain_http: self.plugin_registry_plain_http.clone(),
                ca_pem,
                cache: self.plugin_cache.clone(),
                max_bytes: usize::try_from(self.max_plugin_bytes).unwrap_or(usize::MAX),
                max_total_bytes: usize::try_from(self.plugin_objects_max_total_mb << 20)
                    .unwrap_or(usize::MAX),
                secrets_namespace: identity.namespace.clone(),
                required_keys: if self.plugin_verify_keys.is_empty() {
                    None
                } else {
                    let mut pems = Vec::new();
                    for p in &self.plugin_verify_keys {
                        pems.push(std::fs::read_to_string(p).map_err(|e| {
                            anyhow::anyhow!("--plugin-verify-key {}: {e}", p.display())
                        })?);
                    }
                    Some(
                        wasm_controller_manager::loading::objects::verify::TrustedKeys::parse(
                            &pems,
                        )
                        .map_err(|e| {
                            anyhow::anyhow!(
                                "--plugin-verify-key: {}",
                                e.replace("verify.publicKeys", "key")
                            )
                        })?,
                    )
                },
                ceilings: wasm_controller_manager::loading::objects::spec::Ceilings {
                    hosts: self.plugin_object_hosts.iter().cloned().collect(),
                    ..Default::default()
                },
            })
        } else {
            anyhow::ensure!(
                self.plugin_registries.is_empty(),
                "--plugin-registry is given but --plugin-objects is not"
            );
            None
        };
        Ok(RunConfig {
            plugin_objects,
            record: self.record_dir.map(|d| (d, self.record)),
            memory_reset: self.memory_reset,
            controllers,
            leader_election,
            leader_mode,
            health_addr,
            shutdown_grace: self.shutdown_grace,
            kubeconfig: self.kubeconfig,
            plugins_dir: self.plugins_dir,
            compile_cache: self.compile_cache,
            compile_cache_max_mb: self.compile_cache_max_mb,
            metrics_addr,
            kube_qps: self.kube_qps,
            kube_burst: self.kube_burst,
            api_timeout: Duration::from_secs(self.api_timeout_seconds.max(1)),
            default_workers: self.default_workers.max(1),
            limits: Limits {
                cpu_deadline: Duration::from_millis(self.cpu_deadline_ms),
                memory: (self.memory_mb as usize) << 20,
                ..Limits::default()
            },
            max_instances: self.max_instances.max(1),
            max_plugin_bytes: self.max_plugin_bytes,
            rescan: Duration::from_secs(self.rescan_seconds.max(1)),
            allowed_hosts: self.allowed_hosts,
            event_qps: self.event_qps,
            event_burst: self.event_burst,
            identity,
            budgets: BudgetSettings {
                api_qps: self.plugin_api_qps,
                api_burst: self.plugin_api_burst,
                log_lines_per_second: self.plugin_log_lines_per_second,
                log_burst: (self.plugin_log_lines_per_second * 4.0).max(1.0) as u32,
                max_instances: self.max_instances_per_plugin.max(1),
                cpu_share: self.plugin_cpu_share.max(0.0),
                max_watch_streams: self.max_watch_streams_per_plugin.max(1),
                http_qps: self.plugin_http_qps.max(0.0),
                http_burst: self.plugin_http_burst.max(1),
                min_requeue_after: Duration::from_millis(self.min_requeue_after_ms),
                max_metric_series: self.plugin_metric_series,
            },
            max_workers_per_plugin: self.max_workers_per_plugin.max(1),
            wait_retry: Duration::from_secs(self.wait_retry_seconds.max(1)),
            describe_timeout: Duration::from_secs(self.describe_timeout_seconds.max(1)),
            sync_timeout: Duration::from_secs(self.cache_sync_timeout_seconds.max(1)),
            rate_limits: RateLimits {
                base_delay: Duration::from_millis(self.retry_base_ms),
                max_delay: Duration::from_secs(self.retry_max_seconds),
                qps: self.retry_qps,
                burst: self.retry_burst,
            },
        })
    }
}

/// glibc gives a thread that meets a busy arena an arena of its own (up to 8 per core), and memory
/// freed in an arena is reused only by allocations made in it: the cache's objects, made and
/// dropped on whichever runtime thread the watch task is on, keep the high-water of every arena
/// they passed through. Measured (docs/benchmarks.md, sharded mode): replicas that had taken and
/// given up ranges held up to 2 MiB more cache than one that had not, with the same objects, and
/// none more with one arena, at the same CPU per reconcile. One arena, unless the environment sets
/// the arena count itself (`MALLOC_ARENA_MAX`, or `glibc.malloc.arena_max` in `GLIBC_TUNABLES`):
/// glibc reads those. The compile child starts with an empty environment, so it has one arena
/// always (it is one thread).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn one_malloc_arena() {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() && !tunables.contains("arena_max") {
        // SAFETY: sets an allocator parameter; called first in main, before any thread starts.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn one_malloc_arena() {}

fn main() -> ExitCode {
    one_malloc_arena();
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|e| {
        eprintln!(
            "--log {:?} is not a valid filter ({e}); using \"info\"",
            cli.log
        );
        tracing_subscriber::EnvFilter::new("info")
    });
    // Colours only for a person at a terminal: a log file or collector gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    type Boxed = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;
    let fmt: Boxed = if cli.log_json || cli.log_format == LogFormat::Json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(colour)
            .with_writer(std::io::stderr)
            .boxed()
    };
    // The spans exported as traces never show in the log.
    let not_traces = tracing_subscriber::filter::filter_fn(|m| {
        m.target() != wasm_controller_manager::telemetry::TARGET
    });
    let otlp = match &cli.command {
        Command::Run(args) => args.otlp_endpoint.as_ref().map(|endpoint| {
            wasm_controller_manager::telemetry::OtlpSettings {
                endpoint: endpoint.clone(),
                service_name: args.otlp_service_name.clone(),
                sample_ratio: args.otlp_sample_ratio,
            }
        }),
        _ => None,
    };
    let (tracing_exporter, traces) =
        match otlp.map(|s| wasm_controller_manager::telemetry::Tracing::start(&s)) {
            None => (None, None),
            Some(Ok((t, layer))) => (
                Some(t),
                Some(
                    layer.with_filter(tracing_subscriber::filter::Targets::new().with_target(
                        wasm_controller_manager::telemetry::TARGET,
                        tracing::Level::TRACE,
                    )),
                ),
            ),
            Some(Err(e)) => {
                eprintln!("error: {e:#}");
                return ExitCode::FAILURE;
            }
        };
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter).with_filter(not_traces))
        .with(traces)
        .init();
    if let Command::CompileWorker {
        artifact,
        engine_key,
        parallel_compilation,
        opt_level,
        regalloc,
    } = &cli.command
    {
        return compile_worker(
            artifact,
            engine_key,
            *parallel_compilation,
            opt_level.as_deref(),
            regalloc.as_deref(),
        );
    }
    if cli.max_compile_memory_mb < 16 {
        eprintln!("error: --max-compile-memory-mb must be at least 16");
        return ExitCode::FAILURE;
    }
    wasm_controller_manager::sandbox::compiler::compile_in_child_process(
        wasm_controller_manager::sandbox::compiler::ChildCompile::this_binary(
            cli.max_compile_memory_mb << 20,
        ),
    );
    if matches!(cli.command, Command::Run(_)) {
        wasm_controller_manager::sandbox::compiler::forbid_in_process_fallback();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cli.command {
            Command::Run(args) => app::run(args.into_config()?)
                .await
                .map(|()| ExitCode::SUCCESS),
            Command::Rbac(args) => {
                print!("{}", args.run().await?);
                Ok(ExitCode::SUCCESS)
            }
            Command::Push(args) => {
                print!("{}", args.run().await?);
                Ok(ExitCode::SUCCESS)
            }
            Command::Version => {
                println!(
                    "wasm-controller-manager {}\nplugin contract: wcm:reconciler@0.3.0 (worlds plugin, plugin-with-http); also serves 0.2.0 and 0.1.0",
                    env!("CARGO_PKG_VERSION")
                );
                Ok(ExitCode::SUCCESS)
            }
            Command::Replay {
                recording,
                plugin,
                json,
                compile_cache,
            } => {
                let report = wasm_controller_manager::loading::replay::replay(
                    &recording,
                    &plugin,
                    json,
                    compile_cache,
                )
                .await?;
                print!("{}", report.text);
                Ok(if report.same {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                })
            }
            Command::CompileWorker { .. } => {
                anyhow::bail!("compile-worker runs before the async runtime starts")
            }
            Command::Inspect { plugin, json } => {
                let report =
                    wasm_controller_manager::loading::inspect::inspect(&plugin, json).await?;
                print!("{report}");
                Ok(ExitCode::SUCCESS)
            }
        }
    });
    // What is buffered goes to the collector before the process ends.
    if let Some(t) = tracing_exporter {
        t.shutdown();
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The compile child (`sandbox/compiler.rs`): no async runtime, no plugin directory.
fn compile_worker(
    artifact: &std::path::Path,
    engine_key: &Option<String>,
    parallel_compilation: bool,
    opt_level: Option<&str>,
    regalloc: Option<&str>,
) -> ExitCode {
    use wasm_controller_manager::sandbox::compiler::{WorkerArgs, worker_main};
    let opt_level = match opt_level {
        None => None,
        Some("none") => Some(wasmtime::OptLevel::None),
        Some("speed") => Some(wasmtime::OptLevel::Speed),
        Some("speed-and-size") => Some(wasmtime::OptLevel::SpeedAndSize),
        Some(other) => {
            eprintln!("error: --opt-level {other:?}: none, speed or speed-and-size");
            return ExitCode::FAILURE;
        }
    };
    let regalloc = match regalloc {
        None => None,
        Some("backtracking") => Some(wasmtime::RegallocAlgorithm::Backtracking),
        Some("single-pass") => Some(wasmtime::RegallocAlgorithm::SinglePass),
        Some(other) => {
            eprintln!("error: --regalloc {other:?}: backtracking or single-pass");
            return ExitCode::FAILURE;
        }
    };
    let args = WorkerArgs {
        artifact: artifact.to_path_buf(),
        engine_key: engine_key.clone(),
        parallel_compilation,
        opt_level,
        regalloc,
    };
    match worker_main(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
