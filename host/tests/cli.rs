//! The command line: `inspect` reports what a real plugin declares, and refuses bad files with a
//! clear message and a non-zero exit; `run` refuses bad arguments before it starts, and waits for
//! an API server that does not answer yet.

mod common;

use std::process::Command;

use anyhow::{Context, Result};

fn inspect(path: &std::path::Path, json: bool) -> Result<std::process::Output> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"));
    cmd.arg("inspect").arg(path);
    if json {
        cmd.arg("--json");
    }
    Ok(cmd.output()?)
}

#[test]
fn inspect_prints_the_declaration() -> Result<()> {
    let out = inspect(&common::plugin("pod_counter")?, false)?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("pod-counter"), "{text}");
    assert!(text.contains("v1/Node (metadata only)"), "{text}");
    assert!(text.contains("fixed-key pod-count"), "{text}");
    assert!(text.contains("get,patch nodes (core)"), "{text}");
    assert!(
        text.contains("import        wcm:reconciler/cache@0.3.0"),
        "{text}"
    );
    assert!(
        text.contains("export        wcm:reconciler/reconciler@0.3.0"),
        "{text}"
    );
    // The SDK imports wasi:http only into plugins that send requests.
    assert!(!text.contains("wasi:http"), "{text}");

    let out = inspect(&common::plugin("http-get")?, false)?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("import        wasi:http/outgoing-handler@"),
        "{text}"
    );
    let out = inspect(&common::plugin("http-get")?, true)?;
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["name"], "http-get");
    assert_eq!(v["outboundHosts"][0], "127.0.0.1");
    assert!(v["sizeBytes"].as_u64().is_some_and(|n| n > 0));
    Ok(())
}

#[test]
fn inspect_text_shows_a_watchs_change_filter() -> Result<()> {
    let out = inspect(&common::plugin("status-ignorer")?, false)?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let primary = text
        .lines()
        .find(|l| l.starts_with("primary"))
        .unwrap_or_default();
    assert!(primary.contains("{changes: ignore-status"), "{text}");
    Ok(())
}

#[test]
fn inspect_refuses_bad_files_clearly() -> Result<()> {
    let dir = common::temp_dir("cli")?;
    let junk = dir.join("junk.wasm");
    std::fs::write(&junk, b"not wasm at all")?;
    for (path, needle) in [
        (junk.clone(), "not a WebAssembly file"),
        (dir.join("missing.wasm"), "read"),
        (common::plugin("not-a-plugin")?, "not a plugin of world"),
        (common::plugin("describe-panics")?, "describe failed"),
    ] {
        let out = inspect(&path, false)?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} was accepted", path.display());
        assert!(err.contains(needle), "{}: {err}", path.display());
    }
    Ok(())
}

#[test]
fn rbac_prints_the_grant_of_what_a_plugin_declares() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("rbac")
        .arg(common::plugin("pod_counter")?)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("name: wcm-plugin-pod-counter"), "{text}");
    assert!(text.contains("kind: ClusterRole"), "{text}");
    // Its declared node patch, the list/watch of what it watches, and the host's impersonation of
    // exactly its ServiceAccount.
    let docs: Vec<serde_json::Value> = text
        .split("---\n")
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.starts_with('#'))
        })
        .map(serde_yaml_ng::from_str)
        .collect::<std::result::Result<_, _>>()?;
    let verbs_on = |resource: &str| -> Vec<String> {
        docs.iter()
            .filter(|d| {
                d["kind"] == "ClusterRole" && d["metadata"]["name"] == "wcm-plugin:pod-counter"
            })
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["resources"][0] == resource)
            .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let nodes = verbs_on("nodes");
    for verb in ["get", "patch", "list", "watch"] {
        assert!(nodes.iter().any(|v| v == verb), "nodes: {nodes:?}");
    }
    assert!(!nodes.iter().any(|v| v == "delete"), "nodes: {nodes:?}");
    assert!(text.contains("name: wcm-host:impersonate:"), "{text}");
    assert!(text.contains("- impersonate"), "{text}");
    assert!(
        text.contains("# note:"),
        "offline pluralisation is said: {text}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .args(["rbac", "--plugin-identity-namespace", "Not/A/Namespace"])
        .arg(common::plugin("pod_counter")?)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--plugin-identity-namespace"), "{err}");

    // A plugin that watches every namespace and declares a namespaced write: nothing printed, and
    // what to set is said; an allowance for a plugin not given is a typo, not a no-op.
    let out = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("rbac")
        .arg(common::plugin("well-behaved")?)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing printed");
    assert!(
        err.contains("namespaces = [...]") && err.contains("--all-namespaces well-behaved"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .args(["rbac", "--all-namespaces", "pod-countr"])
        .arg(common::plugin("pod_counter")?)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no plugin given is named \"pod-countr\""),
        "{err}"
    );
    Ok(())
}

fn run_args(args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()?)
}

#[test]
fn bad_run_arguments_are_refused_clearly_before_anything_starts() -> Result<()> {
    let dir = common::temp_dir("cli-run")?;
    let dir = dir.to_str().unwrap_or_default();
    for (args, needle) in [
        (
            vec!["run", "--plugins-dir", dir, "--no-such-flag"],
            "--no-such-flag",
        ),
        (
            vec!["run", "--plugins-dir", "/does/not/exist"],
            "/does/not/exist",
        ),
        (
            vec!["run", "--plugins-dir", dir, "--controllers", "*,Bad_Name"],
            "--controllers",
        ),
        (
            vec!["run", "--plugins-dir", dir, "--controllers", "a,-a"],
            "both enabled and disabled",
        ),
        (
            vec![
                "run",
                "--plugins-dir",
                dir,
                "--kubeconfig",
                "/does/not/exist/kubeconfig",
            ],
            "kubeconfig",
        ),
        (
            vec![
                "run",
                "--plugins-dir",
                dir,
                "--leader-elect=true",
                "--leader-elect-renew-deadline",
                "20s",
            ],
            "renew deadline",
        ),
        (
            vec![
                "run",
                "--plugins-dir",
                dir,
                "--leader-elect-retry-period",
                "soon",
            ],
            "not a duration",
        ),
        (
            vec![
                "run",
                "--plugins-dir",
                dir,
                "--leader-elect-mode",
                "per-node",
            ],
            "--leader-elect-mode",
        ),
        (
            vec!["run", "--plugins-dir", dir, "--health-addr", "8081"],
            "--health-addr",
        ),
        (
            vec![
                "run",
                "--plugins-dir",
                dir,
                "--metrics-addr",
                "127.0.0.1:8080",
                "--health-addr",
                "127.0.0.1:8080",
            ],
            "another port",
        ),
    ] {
        let out = run_args(&args)?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let out = run_args(&["version"])?;
    assert!(out.status.success());
    let version = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        version.contains("wcm:reconciler@0.3.0")
            && version.contains("0.2.0")
            && version.contains("0.1.0"),
        "{version}"
    );
    // Every run flag can come from the environment too, and --help says which variable.
    let out = run_args(&["run", "--help"])?;
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--leader-elect",
        "--controllers",
        "--concurrent-syncs",
        "--kube-api-qps",
        "--leader-elect-mode",
        "--health-addr",
        "--max-watch-streams-per-plugin",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    let flags = help
        .lines()
        .filter(|l| l.trim_start().starts_with("--"))
        .count();
    let envs = help.matches("[env: ").count();
    assert!(
        envs + 1 >= flags,
        "{envs} of {flags} flags have an env variable:\n{help}"
    );
    Ok(())
}

/// An API server that does not answer at start: the host waits for it, retrying, and says so.
#[test]
fn an_unreachable_api_server_is_retried_with_a_clear_log_line() -> Result<()> {
    use std::io::{BufRead, BufReader};
    let dir = common::temp_dir("cli-unreachable")?;
    // Port 1 on loopback: nothing listens there, so every connection is refused at once.
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n",
    )?;
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("run")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--plugins-dir")
        .arg(&plugins)
        .args(["--metrics-addr", "off"])
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut retries = 0;
    while retries < 2 && std::time::Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
            if line.contains("cannot reach the API server, retrying") {
                retries += 1;
            }
            seen.push(line);
        }
    }
    let still_running = child.try_wait()?.is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        retries >= 2,
        "no retry log line within 20 s:\n{}",
        seen.join("\n")
    );
    assert!(still_running, "the host gave up instead of waiting");
    let line = seen
        .iter()
        .find(|l| l.contains("cannot reach"))
        .context("the line")?;
    assert!(
        line.contains("127.0.0.1:1"),
        "the line names the server: {line}"
    );
    Ok(())
}

/// What a newcomer does on a fresh cluster: `rbac --kubeconfig … > grant.yaml; kubectl apply -f
/// grant.yaml`. The namespaces the cluster lacks (the plugins' identity namespace and where the
/// plugin acts) come first as Namespace objects, so the apply succeeds; a namespace that exists,
/// with labels of its own, is not printed, so the apply leaves its labels alone.
#[tokio::test(flavor = "multi_thread")]
async fn rbac_output_applies_with_kubectl_on_a_cluster_lacking_its_namespaces() -> Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::rbac::v1::Role;
    use kube::Api;
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        println!("kubectl is not installed: the apply with kubectl is not tried");
        return Ok(());
    }
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let kubeconfig = env.kubeconfig_path().context("kubeconfig")?.to_path_buf();
    let suffix = std::process::id();
    let (identity_ns, acting_ns) = (
        format!("fresh-ids-{suffix}"),
        format!("fresh-acts-{suffix}"),
    );
    // A namespace that exists, labelled by someone else: it must keep its label.
    let labelled = env.namespace("rbac-labelled").await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            &labelled.name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted"}}})),
        )
        .await?;
    let dir = common::temp_dir("rbac-fresh")?;
    common::install(&dir, "well-behaved", "well-behaved.wasm")?;
    std::fs::write(
        dir.join("well-behaved.toml"),
        format!("namespaces = [\"{acting_ns}\", \"{}\"]\n", labelled.name),
    )?;
    let out = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("rbac")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--plugin-identity-namespace", &identity_ns])
        .arg("--host-service-account")
        .arg(format!("{identity_ns}/host"))
        .arg(dir.join("well-behaved.wasm"))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.matches("kind: Namespace").count(),
        2,
        "the two missing namespaces, not the existing one: {text}"
    );
    for ns in [&identity_ns, &acting_ns] {
        assert!(
            text.contains(&format!("kind: Namespace\nmetadata:\n  name: {ns}\n")),
            "{text}"
        );
    }
    let file = dir.join("grant.yaml");
    std::fs::write(&file, &text)?;
    let applied = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["apply", "-f"])
        .arg(&file)
        .output()?;
    assert!(
        applied.status.success(),
        "kubectl apply -f: {}\n{text}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), &identity_ns);
    assert!(sa.get_opt("wcm-plugin-well-behaved").await?.is_some());
    let roles: Api<Role> = Api::namespaced(client.clone(), &acting_ns);
    assert!(!roles.list(&Default::default()).await?.items.is_empty());
    let still = namespaces.get(&labelled.name).await?;
    assert_eq!(
        still
            .metadata
            .labels
            .unwrap_or_default()
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted")
    );
    for ns in [&identity_ns, &acting_ns] {
        let _ = namespaces.delete(ns, &Default::default()).await;
    }
    Ok(())
}
