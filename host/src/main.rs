use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use wasm_controller_manager::app::{self, RunConfig};
use wasm_controller_manager::rate_limit::RateLimits;
use wasm_controller_manager::sandbox::Limits;

/// A Kubernetes controller manager whose reconcilers are sandboxed WebAssembly components.
#[derive(Parser)]
#[command(name = "wasm-controller-manager", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "info,wasm_controller_manager=debug".
    #[arg(long, env = "WCM_LOG", default_value = "info", global = true)]
    log: String,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run the manager: load every plugin in --plugins-dir and reconcile until SIGTERM.
    Run(RunArgs),
    /// Print what a plugin declares, its imports and exports, its size and compile time.
    Inspect {
        /// The plugin component (.wasm).
        plugin: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
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
    /// Address for /metrics, /healthz, /readyz and /plugins; "off" disables it.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: String,
    /// Client-side limit on API requests per second, for all plugins together.
    #[arg(long, default_value_t = 50.0)]
    kube_qps: f64,
    /// Burst above --kube-qps.
    #[arg(long, default_value_t = 100)]
    kube_burst: u32,
    /// Timeout of one API request made for a plugin, seconds.
    #[arg(long, default_value_t = 30)]
    api_timeout_seconds: u64,
    /// Workers of a plugin that declares none and has no `workers` in its NAME.toml.
    #[arg(long, default_value_t = 1)]
    default_workers: u32,
    /// Guest CPU time per call, milliseconds (NAME.toml: cpu_deadline_ms).
    #[arg(long, default_value_t = 1000)]
    cpu_deadline_ms: u64,
    /// Linear memory per plugin instance, MiB (NAME.toml: memory_mb).
    #[arg(long, default_value_t = 64)]
    memory_mb: u32,
    /// Instances alive at once across all plugins (size of the instance pool).
    #[arg(long, default_value_t = 128)]
    max_instances: u32,
    /// Largest plugin file accepted, bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_plugin_bytes: u64,
    /// Rescan the plugins directory this often, seconds, besides reacting to file events.
    #[arg(long, default_value_t = 30)]
    rescan_seconds: u64,
    /// Hosts (host or host:port) any plugin may reach over HTTP, if it declares them; repeatable.
    #[arg(long = "allow-host")]
    allowed_hosts: Vec<String>,
    /// First retry delay of a failing key, milliseconds (doubles per failure).
    #[arg(long, default_value_t = 5)]
    retry_base_ms: u64,
    /// Largest retry delay of a failing key, seconds.
    #[arg(long, default_value_t = 1000)]
    retry_max_seconds: u64,
    /// Event writes per second to the API server, all plugins together.
    #[arg(long, default_value_t = 20.0)]
    event_qps: f64,
    /// Burst above --event-qps.
    #[arg(long, default_value_t = 50)]
    event_burst: u32,
    /// Retries per second over all keys of a plugin (token bucket).
    #[arg(long, default_value_t = 10.0)]
    retry_qps: f64,
    /// Burst above --retry-qps.
    #[arg(long, default_value_t = 100)]
    retry_burst: u32,
}

impl RunArgs {
    fn into_config(self) -> anyhow::Result<RunConfig> {
        let metrics_addr = match self.metrics_addr.as_str() {
            "off" | "" => None,
            s => Some(
                s.parse::<SocketAddr>()
                    .map_err(|e| anyhow::anyhow!("--metrics-addr {s:?}: {e}"))?,
            ),
        };
        anyhow::ensure!(self.memory_mb > 0, "--memory-mb must be at least 1");
        anyhow::ensure!(
            self.cpu_deadline_ms > 0,
            "--cpu-deadline-ms must be at least 1"
        );
        Ok(RunConfig {
            kubeconfig: self.kubeconfig,
            plugins_dir: self.plugins_dir,
            compile_cache: self.compile_cache,
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
            rate_limits: RateLimits {
                base_delay: Duration::from_millis(self.retry_base_ms),
                max_delay: Duration::from_secs(self.retry_max_seconds),
                qps: self.retry_qps,
                burst: self.retry_burst,
            },
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|e| {
        eprintln!(
            "--log {:?} is not a valid filter ({e}); using \"info\"",
            cli.log
        );
        tracing_subscriber::EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_json {
        builder.json().init();
    } else {
        builder.init();
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
            Command::Run(args) => app::run(args.into_config()?).await,
            Command::Inspect { plugin, json } => {
                let report = wasm_controller_manager::inspect::inspect(&plugin, json).await?;
                print!("{report}");
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
