//! The `testenv` child process and its line protocol on stdin/stdout.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// What `testenv` prints once the cluster is ready.
#[derive(Debug, Clone, Deserialize)]
pub struct ReadyInfo {
    /// `https://127.0.0.1:PORT`
    pub server: String,
    /// Admin kubeconfig written by testenv.
    pub kubeconfig: String,
    /// Admin bearer token (group system:masters).
    pub token: String,
    /// Working directory (etcd data, certificates, logs).
    pub dir: String,
    /// etcd client URL.
    pub etcd: String,
    /// PID of the kube-apiserver child.
    pub apiserver_pid: u32,
    /// The apiserver's log file.
    pub apiserver_log: String,
    /// The apiserver's audit log (JSON lines); empty from a testenv binary that predates it.
    #[serde(default)]
    pub audit_log: String,
}

#[derive(Deserialize)]
struct Reply {
    event: String,
    #[serde(default)]
    error: Option<String>,
}

struct Pipes {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    info: ReadyInfo,
    _child: Child,
}

/// A running `testenv`. Dropping the last handle closes its stdin, which shuts it down.
#[derive(Clone)]
pub struct Control(Arc<Mutex<Pipes>>);

impl Control {
    /// Starts `testenv --stdin-control` and waits for its ready line. testenv bounds the wait
    /// itself (`--ready-timeout`), so a cluster that never gets ready ends in an error, not a hang.
    pub fn spawn(bin: &Path, extra_args: &[&str]) -> Result<Control> {
        let mut child = Command::new(bin)
            .arg("--stdin-control")
            .args(extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let stdin = child.stdin.take().context("testenv stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("testenv stdout")?);
        let stderr = child.stderr.take().context("testenv stderr")?;
        // Keep testenv's own messages, and show them if it fails to start.
        let stderr_lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = stderr_lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                }
            }
        });

        let mut line = String::new();
        let n = stdout
            .read_line(&mut line)
            .context("read testenv's ready line")?;
        if n == 0 {
            let status = child.wait().ok();
            std::thread::sleep(std::time::Duration::from_millis(100));
            let said = stderr_lines
                .lock()
                .map(|v| v.join("\n"))
                .unwrap_or_default();
            bail!("testenv exited before the cluster was ready ({status:?}):\n{said}");
        }
        let info: ReadyInfo = serde_json::from_str(line.trim())
            .with_context(|| format!("testenv printed an unexpected line: {line}"))?;
        Ok(Control(Arc::new(Mutex::new(Pipes {
            stdin,
            stdout,
            info,
            _child: child,
        }))))
    }

    /// What testenv said when it became ready (the latest start).
    pub fn info(&self) -> ReadyInfo {
        match self.0.lock() {
            Ok(p) => p.info.clone(),
            Err(poisoned) => poisoned.into_inner().info.clone(),
        }
    }

    /// Sends one command and waits for the reply event `expect`.
    pub fn command(&self, cmd: &str, expect: &str) -> Result<()> {
        let mut p = self
            .0
            .lock()
            .map_err(|_| anyhow::anyhow!("testenv control lock poisoned"))?;
        writeln!(p.stdin, "{cmd}").context("send a command to testenv")?;
        p.stdin.flush()?;
        let mut line = String::new();
        let n = p
            .stdout
            .read_line(&mut line)
            .context("read testenv's reply")?;
        if n == 0 {
            bail!("testenv exited while handling {cmd:?}");
        }
        let reply: Reply =
            serde_json::from_str(line.trim()).with_context(|| format!("testenv replied {line}"))?;
        if reply.event != expect {
            bail!(
                "testenv {cmd:?} failed: {}",
                reply.error.unwrap_or(reply.event)
            );
        }
        if expect == "ready" {
            p.info = serde_json::from_str(line.trim())?;
        }
        Ok(())
    }
}
