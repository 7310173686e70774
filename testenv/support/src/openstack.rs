//! Test support: real OpenStack Keystone + Neutron API servers on loopback, backed by SQLite.
//!
//! The network plugin talks to Neutron; its tests run against the real Neutron and Keystone code
//! (pinned PyPI releases), so authentication, policies, error bodies and validation are the ones
//! a cloud answers with. [`OpenStack::start`] prepares the servers with
//! `testenv/openstack/build.sh` (cached by content) unless `WCM_OPENSTACK_DIR` names a prepared
//! directory, then runs `testenv/openstack/openstack.py serve`, which copies a template state and
//! starts both services on free ports in a few seconds. Each service appends one JSON line per
//! request it received: [`OpenStack::neutron_requests`] tells a test what really reached Neutron.
//! Dropping the handle stops both services and removes their state; a test that panics keeps
//! their logs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

/// Environment variable naming a directory prepared by `testenv/openstack/build.sh` (skips it).
pub const OPENSTACK_DIR: &str = "WCM_OPENSTACK_DIR";

/// First start: both services import for a few seconds; a loaded machine takes longer.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// A restarted service must answer again within this time.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `openstack.py` may take to clean up after its stdin closes.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// What `openstack.py serve` reports once Keystone and Neutron answer.
#[derive(Debug, Clone, Deserialize)]
pub struct OpenStackInfo {
    /// State directory (databases, configuration, logs); removed when the handle is dropped.
    pub dir: String,
    /// Keystone's identity v3 URL, `http://127.0.0.1:PORT/v3`.
    pub keystone_url: String,
    /// Neutron's URL, `http://127.0.0.1:PORT` (also in the catalog as service type `network`).
    pub neutron_url: String,
    /// `RegionOne`.
    pub region: String,
    /// Id of the project `wcm`, where `username` is a member.
    pub project_id: String,
    pub project_name: String,
    pub user_domain_name: String,
    pub project_domain_name: String,
    /// `wcm-network`: role `member` in project `wcm`, enough for its own networks and subnets.
    pub username: String,
    pub password: String,
    /// An application credential of `username`, scoped to project `wcm`.
    pub application_credential_id: String,
    pub application_credential_secret: String,
    /// Cloud admin (role `admin` in project `admin`).
    pub admin_username: String,
    pub admin_password: String,
    pub admin_project: String,
    /// PIDs at start; see [`OpenStack::neutron_pid`] after a restart.
    pub neutron_pid: u32,
    pub keystone_pid: u32,
    pub neutron_log: String,
    pub keystone_log: String,
    /// One JSON line per request Neutron received ([`RequestRecord`]).
    pub neutron_request_log: String,
    /// One JSON line per request Keystone received ([`RequestRecord`]).
    pub keystone_request_log: String,
}

/// One request as the service saw it. A service writes the line before it sends the response
/// body, so every request whose response a client has read is in the log.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RequestRecord {
    /// Arrival time, Unix seconds.
    pub ts: f64,
    pub method: String,
    /// Path without the query, e.g. `/v2.0/networks`.
    pub path: String,
    /// Raw query string, e.g. `tags=a,b`; empty when none.
    #[serde(default)]
    pub query: String,
    pub status: u16,
    /// Time spent in the service, milliseconds.
    pub ms: f64,
}

#[derive(Deserialize)]
struct Reply {
    event: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    pid: Option<u32>,
}

struct Control {
    child: Child,
    /// `None` once closed: closing it tells `openstack.py` to shut everything down.
    stdin: Option<ChildStdin>,
    /// Lines of `openstack.py`'s stdout, read by a thread so that waits can time out.
    lines: Receiver<String>,
    neutron_pid: u32,
    keystone_pid: u32,
}

impl Control {
    fn shutdown(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => break,
            }
        }
        // Its children die with it (they watch their parent).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Keystone + Neutron owned by this process. Dropping it stops both.
pub struct OpenStack {
    info: OpenStackInfo,
    control: Mutex<Control>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl OpenStack {
    /// Starts Keystone and Neutron with a fresh copy of the template state and waits until
    /// Neutron answers an authenticated request (at most two minutes).
    pub async fn start() -> Result<OpenStack> {
        tokio::task::spawn_blocking(Self::start_blocking)
            .await
            .context("OpenStack start task failed")?
    }

    fn start_blocking() -> Result<OpenStack> {
        let dir = prepared_dir()?;
        let python = dir.join("bin/python");
        let script = crate::repo_root().join("testenv/openstack/openstack.py");
        let mut child = Command::new(&python)
            .arg(&script)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {} {} serve", python.display(), script.display()))?;
        let stdin = child.stdin.take().context("openstack.py stdin")?;
        let stdout = child.stdout.take().context("openstack.py stdout")?;
        let stderr = child.stderr.take().context("openstack.py stderr")?;
        // Keep openstack.py's own messages, and show them if it fails.
        let said = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                }
            }
        });
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut control = Control {
            child,
            stdin: Some(stdin),
            lines,
            neutron_pid: 0,
            keystone_pid: 0,
        };

        let line = match control.lines.recv_timeout(READY_TIMEOUT) {
            Ok(line) => line,
            Err(e) => {
                let _ = control.child.kill();
                let status = control.child.wait().ok();
                // Let the stderr thread catch the last lines.
                std::thread::sleep(Duration::from_millis(200));
                let why = match e {
                    RecvTimeoutError::Timeout => {
                        format!("was not ready within {}s", READY_TIMEOUT.as_secs())
                    }
                    RecvTimeoutError::Disconnected => {
                        format!("exited before Keystone and Neutron were ready ({status:?})")
                    }
                };
                bail!("openstack.py serve {why}:\n{}", joined(&said));
            }
        };
        let info: OpenStackInfo = match serde_json::from_str(line.trim()) {
            Ok(info) => info,
            Err(e) => {
                control.shutdown();
                bail!(
                    "openstack.py printed an unexpected line ({e}): {line}\n{}",
                    joined(&said)
                );
            }
        };
        control.neutron_pid = info.neutron_pid;
        control.keystone_pid = info.keystone_pid;
        Ok(OpenStack {
            info,
            control: Mutex::new(control),
            stderr: said,
        })
    }

    /// What `openstack.py` reported when both services became ready.
    pub fn info(&self) -> &OpenStackInfo {
        &self.info
    }

    /// Stops Neutron (SIGTERM): clients get "connection refused" until [`Self::start_neutron`].
    pub fn stop_neutron(&self) -> Result<()> {
        self.command("stop neutron")
    }

    /// Starts Neutron again on the same port with the same database, and waits until it answers.
    pub fn start_neutron(&self) -> Result<()> {
        self.command("start neutron")
    }

    /// Kills Neutron (SIGKILL, as a crash would).
    pub fn kill_neutron(&self) -> Result<()> {
        self.command("kill neutron")
    }

    /// Stops Keystone: new tokens cannot be had, and Neutron cannot check tokens it has not cached.
    pub fn stop_keystone(&self) -> Result<()> {
        self.command("stop keystone")
    }

    /// Starts Keystone again on the same port with the same database and keys (tokens stay valid).
    pub fn start_keystone(&self) -> Result<()> {
        self.command("start keystone")
    }

    /// PID of the running Neutron (0 while stopped).
    pub fn neutron_pid(&self) -> u32 {
        self.lock_control().neutron_pid
    }

    /// PID of the running Keystone (0 while stopped).
    pub fn keystone_pid(&self) -> u32 {
        self.lock_control().keystone_pid
    }

    /// Every request Neutron received so far, in the order they completed.
    pub fn neutron_requests(&self) -> Result<Vec<RequestRecord>> {
        read_requests(Path::new(&self.info.neutron_request_log))
    }

    /// Every request Keystone received so far, in the order they completed.
    pub fn keystone_requests(&self) -> Result<Vec<RequestRecord>> {
        read_requests(Path::new(&self.info.keystone_request_log))
    }

    fn lock_control(&self) -> std::sync::MutexGuard<'_, Control> {
        match self.control.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Sends one line command and waits for its `<verb>-done` reply.
    fn command(&self, cmd: &str) -> Result<()> {
        let (verb, service) = cmd.split_once(' ').unwrap_or((cmd, ""));
        let mut c = self
            .control
            .lock()
            .map_err(|_| anyhow!("OpenStack control lock poisoned"))?;
        let stdin = c
            .stdin
            .as_mut()
            .context("openstack.py was already shut down")?;
        writeln!(stdin, "{cmd}").context("send a command to openstack.py")?;
        stdin.flush().context("send a command to openstack.py")?;
        let line = match c.lines.recv_timeout(COMMAND_TIMEOUT) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => bail!(
                "openstack.py did not answer {cmd:?} within {}s",
                COMMAND_TIMEOUT.as_secs()
            ),
            Err(RecvTimeoutError::Disconnected) => bail!(
                "openstack.py exited while handling {cmd:?}:\n{}",
                joined(&self.stderr)
            ),
        };
        let reply: Reply = serde_json::from_str(line.trim())
            .with_context(|| format!("openstack.py replied {line}"))?;
        if reply.event != format!("{verb}-done") {
            bail!(
                "openstack.py {cmd:?} failed: {}",
                reply.error.unwrap_or(reply.event)
            );
        }
        let pid = reply.pid.unwrap_or(0);
        match service {
            "neutron" => c.neutron_pid = pid,
            "keystone" => c.keystone_pid = pid,
            _ => {}
        }
        Ok(())
    }

    /// Copies the services' logs and configuration out of the state directory, which goes away.
    fn keep_logs(&self) {
        static KEPT: AtomicU32 = AtomicU32::new(0);
        let base = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::repo_root().join("target"));
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let dest = base.join("openstack-logs").join(format!(
            "{stamp}-{}-{}",
            std::process::id(),
            KEPT.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(e) = std::fs::create_dir_all(&dest) {
            eprintln!(
                "OpenStack logs not kept: create {}: {e}; they were in {}",
                dest.display(),
                self.info.dir
            );
            return;
        }
        let files = [
            "neutron.log",
            "keystone.log",
            "neutron-requests.log",
            "keystone-requests.log",
            "neutron.conf",
            "ml2_conf.ini",
            "keystone.conf",
        ];
        for name in files {
            let src = Path::new(&self.info.dir).join(name);
            if src.is_file() {
                let _ = std::fs::copy(&src, dest.join(name));
            }
        }
        eprintln!(
            "OpenStack (Keystone + Neutron) logs kept on failure: {}",
            dest.display()
        );
    }
}

impl Drop for OpenStack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.keep_logs();
        }
        let control = match self.control.get_mut() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        control.shutdown();
    }
}

fn joined(lines: &Mutex<Vec<String>>) -> String {
    lines.lock().map(|v| v.join("\n")).unwrap_or_default()
}

/// Parses a request log; a line that does not parse (none expected) is skipped.
fn read_requests(path: &Path) -> Result<Vec<RequestRecord>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// The directory with the venv (`bin/python`) and `template/`: `WCM_OPENSTACK_DIR`, or the
/// cached result of `testenv/openstack/build.sh`.
pub fn prepared_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(OPENSTACK_DIR) {
        let dir = PathBuf::from(dir);
        anyhow::ensure!(
            dir.join("bin/python").is_file() && dir.join("template/credentials.json").is_file(),
            "{OPENSTACK_DIR}={} is not a directory prepared by testenv/openstack/build.sh (no bin/python or template/)",
            dir.display()
        );
        return Ok(dir);
    }
    crate::run_build_script("testenv/openstack/build.sh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_parse() {
        let dir = std::env::temp_dir().join(format!("wcm-openstack-rs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("neutron-requests.log");
        std::fs::write(
            &path,
            concat!(
                r#"{"ts": 1795402199.28, "method": "POST", "path": "/v2.0/networks", "query": "", "status": 201, "ms": 104.5}"#,
                "\n",
                r#"{"ts": 1795402200.62, "method": "GET", "path": "/v2.0/networks", "query": "tags=a,b", "status": 200, "ms": 14.2}"#,
                "\n",
                "not json\n",
            ),
        )
        .unwrap();
        let records = read_requests(&path).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].method, "POST");
        assert_eq!(records[0].status, 201);
        assert_eq!(records[1].query, "tags=a,b");
        assert!(read_requests(&dir.join("missing.log")).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
