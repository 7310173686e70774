//! Renders a kustomization as `kubectl kustomize DIR` does, with the `testenv` binary (the same
//! kustomize library kubectl v1.36 uses), so no kubectl is needed.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{TESTENV_BIN, testenv_binary};

/// Rendering a few files takes well under a second; a binary still running after this is one
/// built before the `kustomize` subcommand, which starts a cluster instead.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The YAML stream `kubectl kustomize dir` prints.
pub fn kustomize(dir: &Path) -> Result<String> {
    let bin = testenv_binary()?;
    let mut child = Command::new(&bin)
        .arg("kustomize")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {} kustomize", bin.display()))?;
    // Read both pipes while waiting, so a large output cannot fill a pipe and stall the child.
    let stdout = reader(child.stdout.take());
    let stderr = reader(child.stderr.take());
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{} kustomize {} did not finish in {TIMEOUT:?}: a testenv binary older than its `kustomize` subcommand starts a cluster instead; rebuild it with testenv/build.sh (or unset {TESTENV_BIN})",
                bin.display(),
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = stdout
        .join()
        .map_err(|_| anyhow::anyhow!("stdout reader panicked"))?;
    let err = stderr
        .join()
        .map_err(|_| anyhow::anyhow!("stderr reader panicked"))?;
    if !status.success() {
        bail!(
            "kustomize {} failed ({status}): {}",
            dir.display(),
            String::from_utf8_lossy(&err).trim()
        );
    }
    String::from_utf8(out).context("kustomize printed something that is not UTF-8")
}

fn reader(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}
