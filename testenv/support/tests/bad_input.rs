//! testenv fails fast with an error that names the cause, and cleans up after itself.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

fn run_testenv(args: &[&str]) -> Result<(bool, String)> {
    let bin = testenv::testenv_binary()?;
    let out = Command::new(bin).args(args).stdin(Stdio::null()).output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn apiserver_port_clash_is_named() -> Result<()> {
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port().to_string();
    let (ok, stderr) = run_testenv(&["--port", &port, "--ready-timeout", "60s"])?;
    assert!(!ok, "testenv started on a taken port");
    assert!(
        stderr.contains("port clash") && stderr.contains(&port),
        "stderr: {stderr}"
    );
    Ok(())
}

#[test]
fn etcd_port_clash_is_named() -> Result<()> {
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port().to_string();
    let (ok, stderr) = run_testenv(&["--etcd-port", &port])?;
    assert!(!ok);
    assert!(
        stderr.contains("port clash") && stderr.contains("etcd"),
        "stderr: {stderr}"
    );
    Ok(())
}

#[test]
fn apiserver_that_never_gets_ready_times_out() -> Result<()> {
    let started = Instant::now();
    let (ok, stderr) = run_testenv(&["--ready-timeout", "1s"])?;
    assert!(!ok);
    assert!(stderr.contains("not ready"), "stderr: {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    Ok(())
}

#[test]
fn missing_go_toolchain_is_named() -> Result<()> {
    let cache = tempdir()?;
    let script = testenv::repo_root().join("testenv/build.sh");
    // A PATH with the basic tools but no `go`.
    let out = Command::new("/bin/bash")
        .arg(&script)
        .env("PATH", "/usr/bin:/bin")
        .env("WCM_CACHE_DIR", &cache)
        .output()?;
    if which_go_in("/usr/bin:/bin") {
        eprintln!("skipped: this machine has go in /usr/bin or /bin");
        return Ok(());
    }
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Go toolchain") && stderr.contains("not on PATH"),
        "stderr: {stderr}"
    );
    std::fs::remove_dir_all(&cache).ok();
    Ok(())
}

#[test]
fn stops_cleanly_when_its_parent_goes() -> Result<()> {
    let bin = testenv::testenv_binary()?;
    let mut child = Command::new(bin)
        .arg("--stdin-control")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().context("stdout")?),
        &mut line,
    )?;
    let ready: serde_json::Value =
        serde_json::from_str(&line).with_context(|| format!("ready line: {line}"))?;
    let pid = ready["apiserver_pid"].as_u64().context("apiserver_pid")?;
    let dir = ready["dir"].as_str().context("dir")?.to_string();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    assert!(Path::new(&dir).exists());

    drop(child.stdin.take()); // EOF: what happens when a test process exits
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait()?.is_none() {
        assert!(
            Instant::now() < deadline,
            "testenv did not exit after stdin closed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "kube-apiserver {pid} outlived testenv"
    );
    assert!(!Path::new(&dir).exists(), "{dir} was not removed");
    Ok(())
}

#[test]
fn metric_parser_sums_matching_series() {
    let text = "# HELP x\nx{verb=\"WATCH\",resource=\"pods\"} 2\nx{verb=\"WATCH\",resource=\"nodes\"} 3\nx{verb=\"LIST\"} 7\ny 1\n";
    assert_eq!(testenv::sum_metric(text, "x", &[("verb", "WATCH")]), 5.0);
    assert_eq!(
        testenv::sum_metric(text, "x", &[("verb", "WATCH"), ("resource", "pods")]),
        2.0
    );
    assert_eq!(testenv::sum_metric(text, "y", &[]), 1.0);
    assert_eq!(testenv::sum_metric(text, "z", &[]), 0.0);
}

fn tempdir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("wcm-nogo-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

fn which_go_in(path: &str) -> bool {
    path.split(':').any(|d| Path::new(d).join("go").exists())
}
