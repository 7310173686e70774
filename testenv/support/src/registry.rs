//! Test support: a real OCI registry on loopback (CNCF distribution v3, `testenv/registry/`), and
//! pushing wasm components to it.
//!
//! [`Registry::start`] runs `testenv-registry` (built and cached by `testenv/registry/build.sh`
//! unless `WCM_TESTENV_REGISTRY_BIN` names a binary) on `127.0.0.1` with a fresh storage directory:
//! plain HTTP or TLS from a CA it generates ([`Registry::ca_pem`]), with or without basic auth
//! ([`Registry::credentials`]). It appends one JSON line per request it received:
//! [`Registry::requests`] tells a test what really reached the registry. [`Registry::stop`] and
//! [`Registry::resume`] take it down (clients get "connection refused") and bring it back on the
//! same port with the same content. [`Registry::push`] pushes a `.wasm` in the CNCF wasm artifact
//! layout or the older wasm-to-oci one; [`Registry::push_with`] pushes deliberately broken
//! artifacts for failure tests. Dropping the handle stops the registry and removes its directory.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;
use serde::Deserialize;

/// Environment variable naming a prebuilt `testenv-registry` (skips `testenv/registry/build.sh`).
pub const TESTENV_REGISTRY_BIN: &str = "WCM_TESTENV_REGISTRY_BIN";

/// The registry answers within a second; a loaded machine takes longer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// `start` retries for 10 s while the old port is still held.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// How the registry serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryOptions {
    /// HTTPS with a server certificate for `127.0.0.1` from a CA generated at start.
    pub tls: bool,
    /// HTTP basic auth (htpasswd) with a generated user and password.
    pub auth: bool,
}

/// What `testenv-registry` prints when it answers (and again after [`Registry::resume`]).
#[derive(Debug, Clone, Deserialize)]
pub struct RegistryInfo {
    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`.
    pub url: String,
    /// `127.0.0.1:PORT`: the registry part of a reference.
    pub host: String,
    /// The CA's PEM file; empty without TLS.
    pub ca_file: String,
    /// Basic auth user and password; empty without auth.
    pub username: String,
    pub password: String,
    /// One JSON line per request ([`RegistryRequest`]).
    pub request_log: String,
    /// The storage directory (distribution's filesystem driver).
    pub storage: String,
    /// distribution's own log (warnings and errors, e.g. refused credentials).
    pub log: String,
    /// Working directory; removed when the handle is dropped.
    pub dir: String,
    pub pid: u32,
}

/// One request as the registry saw it. The line is written before the last byte of the response
/// leaves the registry, so every request whose response a client has read is in the log.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RegistryRequest {
    /// Arrival time, RFC 3339.
    pub time: String,
    pub method: String,
    /// Path without the query, e.g. `/v2/plugins/pod-counter/manifests/sha256:…`.
    pub path: String,
    #[serde(default)]
    pub query: String,
    pub status: u16,
    /// Size of the response body.
    pub bytes: u64,
    /// Whether the request carried an `Authorization` header.
    pub auth: bool,
    /// The basic-auth user it named (never the password); empty otherwise.
    #[serde(default)]
    pub user: String,
    /// The request's `Accept` header.
    #[serde(default)]
    pub accept: String,
    /// The response's `Content-Type` (a manifest's media type).
    #[serde(default)]
    pub content_type: String,
    /// The response's `Docker-Content-Digest`, when it has one.
    #[serde(default)]
    pub digest: String,
    /// Time spent in the registry, milliseconds.
    pub ms: f64,
}

/// Basic-auth credentials of a registry started with `auth`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// How a component is laid out in the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The CNCF wasm OCI artifact: config `application/vnd.wasm.config.v0+json`
    /// (`architecture: wasm`, `os: wasip2`, `layerDigests`, `component` imports and exports), one
    /// `application/wasm` layer, an OCI image manifest.
    Cncf,
    /// The older wasm-to-oci layout (kwctl, oci-client's `WASM_*` constants): config
    /// `application/vnd.wasm.config.v1+json` (`{}`), layer
    /// `application/vnd.wasm.content.layer.v1+wasm`.
    WasmToOci,
}

/// The CNCF layout's media types.
pub const CNCF_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
pub const CNCF_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The wasm-to-oci layout's media types.
pub const WASM_TO_OCI_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v1+json";
pub const WASM_TO_OCI_LAYER_MEDIA_TYPE: &str = "application/vnd.wasm.content.layer.v1+wasm";
/// Both layouts use an OCI image manifest.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

impl Layout {
    fn flag(self) -> &'static str {
        match self {
            Layout::Cncf => "cncf",
            Layout::WasmToOci => "wasm-to-oci",
        }
    }
}

/// Ways to break a pushed artifact, for failure tests. The default breaks nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Broken {
    /// A second wasm layer (the component with a custom section appended: valid, different).
    pub two_wasm_layers: bool,
    /// The layer's media type instead of the layout's (e.g. a tar layer).
    pub layer_media_type: Option<String>,
    /// The layer is the component padded with zeros to this many bytes (really stored and served).
    pub huge_layer: Option<u64>,
    /// The manifest claims this layer size; the stored blob is the real component.
    pub claim_layer_size: Option<u64>,
    /// After the push the layer blob is deleted from the repository; the manifest stays.
    pub delete_layer: bool,
    /// After the push one byte of the stored layer is flipped (same size, wrong content).
    pub corrupt_layer: bool,
}

/// What a push stored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Pushed {
    /// The manifest's digest, `sha256:…`.
    pub digest: String,
    /// `127.0.0.1:PORT/REPO@sha256:…`.
    pub reference: String,
    /// The manifest's size in bytes.
    pub size: u64,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
    /// As the manifest states them (see [`Broken::claim_layer_size`]).
    pub layer_sizes: Vec<u64>,
}

#[derive(Deserialize)]
struct Event {
    event: String,
    #[serde(default)]
    error: Option<String>,
}

struct Control {
    child: Child,
    /// `None` once closed: closing it stops the registry.
    stdin: Option<ChildStdin>,
    /// Lines of the registry's stdout, read by a thread so that waits can time out.
    lines: Receiver<String>,
}

impl Control {
    fn shutdown(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The next stdout line, or why there is none.
    fn next_line(&mut self, timeout: Duration, stderr: &Mutex<Vec<String>>) -> Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => {
                bail!(
                    "testenv-registry did not answer within {}s",
                    timeout.as_secs()
                )
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                std::thread::sleep(Duration::from_millis(100));
                bail!("testenv-registry exited ({status:?}):\n{}", joined(stderr))
            }
        }
    }
}

/// A registry owned by this process. Dropping it stops the registry and removes its storage.
pub struct Registry {
    bin: PathBuf,
    info: RegistryInfo,
    ca_pem: Option<String>,
    control: Mutex<Control>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Registry {
    /// Builds (cached) and starts a registry on a free port of 127.0.0.1 and waits until it
    /// answers.
    pub async fn start(options: RegistryOptions) -> Result<Registry> {
        tokio::task::spawn_blocking(move || Self::start_blocking(options))
            .await
            .context("registry start task")?
    }

    fn start_blocking(options: RegistryOptions) -> Result<Registry> {
        let bin = registry_binary()?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--stdin-control");
        if options.tls {
            cmd.arg("--tls");
        }
        if options.auth {
            cmd.arg("--auth");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let stdin = child.stdin.take().context("testenv-registry stdin")?;
        let stdout = child.stdout.take().context("testenv-registry stdout")?;
        let stderr = child.stderr.take().context("testenv-registry stderr")?;
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
        };
        let line = match control.next_line(READY_TIMEOUT, &said) {
            Ok(line) => line,
            Err(e) => {
                control.shutdown();
                return Err(e.context("start the test registry"));
            }
        };
        let info = match parse_ready(&line) {
            Ok(info) => info,
            Err(e) => {
                control.shutdown();
                return Err(e);
            }
        };
        let ca_pem = if info.ca_file.is_empty() {
            None
        } else {
            match std::fs::read_to_string(&info.ca_file) {
                Ok(pem) => Some(pem),
                Err(e) => {
                    control.shutdown();
                    bail!("read the registry's CA {}: {e}", info.ca_file);
                }
            }
        };
        Ok(Registry {
            bin,
            info,
            ca_pem,
            control: Mutex::new(control),
            stderr: said,
        })
    }

    /// What the registry reported when it became ready.
    pub fn info(&self) -> &RegistryInfo {
        &self.info
    }

    /// `http(s)://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.info.url
    }

    /// `127.0.0.1:PORT`, the registry part of a reference.
    pub fn host(&self) -> &str {
        &self.info.host
    }

    /// `HOST/REPO@DIGEST`.
    pub fn reference(&self, repo: &str, digest: &str) -> String {
        format!("{}/{repo}@{digest}", self.info.host)
    }

    /// The PEM of the CA that signed the registry's certificate (with TLS).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The basic-auth user and password (with auth).
    pub fn credentials(&self) -> Option<Credentials> {
        (!self.info.username.is_empty()).then(|| Credentials {
            username: self.info.username.clone(),
            password: self.info.password.clone(),
        })
    }

    /// The content of a `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson` key for
    /// this registry: its host with the credentials (none without auth).
    pub fn dockerconfigjson(&self) -> String {
        let entry = match self.credentials() {
            Some(c) => serde_json::json!({
                "username": c.username,
                "password": c.password,
                "auth": base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.password)),
            }),
            None => serde_json::json!({}),
        };
        serde_json::json!({ "auths": { self.info.host.clone(): entry } }).to_string()
    }

    /// Every request the registry received so far, in the order it answered them.
    pub fn requests(&self) -> Result<Vec<RegistryRequest>> {
        read_requests(Path::new(&self.info.request_log))
    }

    /// The current end of the request log, for [`Registry::requests_since`].
    pub fn request_mark(&self) -> Result<usize> {
        Ok(self.requests()?.len())
    }

    /// The requests the registry answered after `mark` was taken.
    pub fn requests_since(&self, mark: usize) -> Result<Vec<RegistryRequest>> {
        Ok(self.requests()?.into_iter().skip(mark).collect())
    }

    /// Takes the registry down: the listener and every open connection are closed, new
    /// connections are refused. The storage stays.
    pub fn stop(&self) -> Result<()> {
        self.command("stop", "stopped")
    }

    /// Brings a stopped registry back on the same port with the same storage and credentials.
    pub fn resume(&self) -> Result<()> {
        self.command("start", "ready")
    }

    /// Pushes `wasm` as `repo:tag` in `layout` and returns the manifest's digest.
    pub async fn push(&self, wasm: &Path, repo: &str, tag: &str, layout: Layout) -> Result<String> {
        Ok(self
            .push_with(wasm, repo, tag, layout, &Broken::default())
            .await?
            .digest)
    }

    /// Pushes `wasm` as `repo:tag` in `layout`, broken as `broken` says.
    pub async fn push_with(
        &self,
        wasm: &Path,
        repo: &str,
        tag: &str,
        layout: Layout,
        broken: &Broken,
    ) -> Result<Pushed> {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.arg("push")
            .arg("--json")
            .args(["--registry", &self.info.host])
            .args(["--repo", repo, "--tag", tag, "--layout", layout.flag()])
            .arg("--wasm")
            .arg(wasm);
        if self.info.ca_file.is_empty() {
            cmd.arg("--plain-http");
        } else {
            cmd.args(["--ca", &self.info.ca_file]);
        }
        if let Some(c) = self.credentials() {
            cmd.args(["--username", &c.username, "--password", &c.password]);
        }
        if broken.two_wasm_layers {
            cmd.arg("--two-wasm-layers");
        }
        if let Some(t) = &broken.layer_media_type {
            cmd.args(["--layer-media-type", t]);
        }
        if let Some(n) = broken.huge_layer {
            cmd.arg("--huge-layer").arg(n.to_string());
        }
        if let Some(n) = broken.claim_layer_size {
            cmd.arg("--claim-layer-size").arg(n.to_string());
        }
        if broken.delete_layer {
            cmd.arg("--delete-layer");
        }
        if broken.corrupt_layer {
            cmd.args(["--corrupt-layer", "--storage", &self.info.storage]);
        }
        let out = cmd
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("run {} push", self.bin.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "testenv-registry push {} to {repo}:{tag} failed ({}): {}",
            wasm.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.trim())
            .with_context(|| format!("testenv-registry push printed {stdout}"))
    }

    fn lock_control(&self) -> MutexGuard<'_, Control> {
        match self.control.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Sends one command and waits for the reply event `expect`.
    fn command(&self, cmd: &str, expect: &str) -> Result<()> {
        let mut c = self.lock_control();
        let stdin = c
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("testenv-registry was already shut down"))?;
        writeln!(stdin, "{cmd}").context("send a command to testenv-registry")?;
        stdin
            .flush()
            .context("send a command to testenv-registry")?;
        let line = c
            .next_line(COMMAND_TIMEOUT, &self.stderr)
            .with_context(|| format!("testenv-registry {cmd:?}"))?;
        let reply: Event = serde_json::from_str(line.trim())
            .with_context(|| format!("testenv-registry replied {line}"))?;
        if reply.event != expect {
            bail!(
                "testenv-registry {cmd:?} failed: {}",
                reply.error.unwrap_or(reply.event)
            );
        }
        Ok(())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "test registry at {}: request log {} (removed with the registry)",
                self.info.url, self.info.request_log
            );
        }
        let control = match self.control.get_mut() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        control.shutdown();
    }
}

fn parse_ready(line: &str) -> Result<RegistryInfo> {
    let event: Event = serde_json::from_str(line.trim())
        .with_context(|| format!("testenv-registry printed an unexpected line: {line}"))?;
    if event.event != "ready" {
        bail!(
            "testenv-registry did not start: {}",
            event.error.unwrap_or(event.event)
        );
    }
    serde_json::from_str(line.trim())
        .with_context(|| format!("testenv-registry's ready line: {line}"))
}

fn joined(lines: &Mutex<Vec<String>>) -> String {
    lines.lock().map(|v| v.join("\n")).unwrap_or_default()
}

/// Parses a request log; a line that does not parse (none expected) is skipped.
fn read_requests(path: &Path) -> Result<Vec<RegistryRequest>> {
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

/// Environment variable naming a prebuilt `cosign` (skips `testenv/cosign/build.sh`).
pub const TESTENV_COSIGN_BIN: &str = "WCM_TESTENV_COSIGN_BIN";

/// The real `cosign` CLI (sigstore/cosign v2, built from Go modules by `testenv/cosign/build.sh`):
/// `WCM_TESTENV_COSIGN_BIN`, or the cached build.
pub fn cosign_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(TESTENV_COSIGN_BIN) {
        let bin = PathBuf::from(bin);
        anyhow::ensure!(
            bin.is_file(),
            "{TESTENV_COSIGN_BIN}={} is not a file",
            bin.display()
        );
        return Ok(bin);
    }
    crate::run_build_script("testenv/cosign/build.sh")
}

/// Runs cosign in `dir` with an empty key password, no transparency log and no other network
/// than the test registry (trusted through its CA, logged in through a docker config in `dir`).
fn cosign(dir: &Path, registry: Option<&Registry>, args: &[&str]) -> Result<String> {
    let bin = cosign_binary()?;
    let mut cmd = Command::new(&bin);
    cmd.current_dir(dir)
        .args(args)
        .env("COSIGN_PASSWORD", "")
        .env("COSIGN_YES", "true")
        // Nothing is fetched from the public good instance: its TUF root stays empty here.
        .env("TUF_ROOT", dir.join("tuf"))
        .env("SIGSTORE_NO_CACHE", "true")
        // Its keyless mode would reach Fulcio and Rekor.
        .env_remove("COSIGN_EXPERIMENTAL")
        .env("HOME", dir)
        .env("DOCKER_CONFIG", dir);
    if let Some(r) = registry {
        std::fs::write(dir.join("config.json"), r.dockerconfigjson())?;
        if !r.info.ca_file.is_empty() {
            cmd.env("SSL_CERT_FILE", &r.info.ca_file);
        }
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "cosign {} failed ({}): {}",
        args.first().copied().unwrap_or_default(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A cosign key pair in `dir` (`cosign generate-key-pair`): the private key's path and the
/// public key's PEM.
pub fn cosign_key_pair(dir: &Path) -> Result<(PathBuf, String)> {
    std::fs::create_dir_all(dir)?;
    cosign(dir, None, &["generate-key-pair"])?;
    let public = std::fs::read_to_string(dir.join("cosign.pub")).context("cosign.pub")?;
    Ok((dir.join("cosign.key"), public))
}

impl Registry {
    /// Signs `reference` (`HOST/REPO@sha256:…`) with the cosign private key `key`, as
    /// `cosign sign --key KEY --tlog-upload=false --new-bundle-format=false
    /// --use-signing-config=false --yes` does: the signature goes to this registry only, as the
    /// legacy `sha256-HEX.sig` tag (a simple-signing payload layer with the
    /// `dev.cosignproject.cosign/signature` annotation).
    pub fn cosign_sign(&self, reference: &str, key: &Path) -> Result<()> {
        let dir = key.parent().context("the key's directory")?;
        let key = key.to_str().context("key path")?;
        cosign(
            dir,
            Some(self),
            &[
                "sign",
                "--key",
                key,
                "--tlog-upload=false",
                // The legacy `sha256-HEX.sig` tag (v2.6's defaults, said so a newer cosign
                // does not switch to the bundle format or ask a TUF repository for service URLs).
                "--new-bundle-format=false",
                "--use-signing-config=false",
                "--yes",
                reference,
            ],
        )?;
        Ok(())
    }
}

/// The `testenv-registry` binary: `WCM_TESTENV_REGISTRY_BIN`, or the cached build from
/// `testenv/registry/build.sh`.
pub fn registry_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(TESTENV_REGISTRY_BIN) {
        let bin = PathBuf::from(bin);
        anyhow::ensure!(
            bin.is_file(),
            "{TESTENV_REGISTRY_BIN}={} is not a file",
            bin.display()
        );
        return Ok(bin);
    }
    crate::run_build_script("testenv/registry/build.sh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_parse() {
        let dir = std::env::temp_dir().join(format!("wcm-registry-rs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("requests.log");
        std::fs::write(
            &path,
            concat!(
                r#"{"time":"2026-11-26T18:54:11.12Z","method":"GET","path":"/v2/p/manifests/v1","query":"","status":200,"bytes":514,"auth":true,"user":"wcm-1","accept":"application/vnd.oci.image.manifest.v1+json","content_type":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:6f","ms":1.34}"#,
                "\n",
                r#"{"time":"2026-11-26T18:54:11.22Z","method":"GET","path":"/v2/p/manifests/v1","query":"","status":401,"bytes":162,"auth":false,"user":"","accept":"*/*","content_type":"application/json","digest":"","ms":0.17}"#,
                "\n",
                "not json\n",
            ),
        )
        .unwrap();
        let records = read_requests(&path).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].user, "wcm-1");
        assert!(records[0].auth);
        assert_eq!(records[1].status, 401);
        assert!(!records[1].auth);
        assert!(read_requests(&dir.join("missing.log")).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_error_line_is_not_taken_for_ready() {
        let err = parse_ready(r#"{"event":"error","error":"listen on 127.0.0.1:1: denied"}"#)
            .unwrap_err();
        assert!(err.to_string().contains("denied"), "{err}");
        let info = parse_ready(
            r#"{"event":"ready","url":"http://127.0.0.1:5000","host":"127.0.0.1:5000","ca_file":"","username":"","password":"","request_log":"/r","storage":"/s","log":"/l","dir":"/d","pid":7}"#,
        )
        .unwrap();
        assert_eq!(info.host, "127.0.0.1:5000");
    }
}
