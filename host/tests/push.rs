//! `wasm-controller-manager push FILE REGISTRY/REPOSITORY:TAG` against a real OCI registry (CNCF
//! distribution on loopback, `testenv/registry/`, TLS from its own CA and basic auth), judged by
//! what the registry saw (its request log) and serves (a manifest and a config read back with
//! curl, an independent client): the CNCF wasm artifact layout, the tag, the printed digest is
//! the manifest's, the config's component names are those the Go test tool reads from the same
//! file, and the host's own pull side gets the same bytes back. Refusals (a core module, junk, a
//! file over `--max-plugin-bytes`, a wrong password) leave nothing in the registry.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use common::*;
use serde_json::Value;
use testenv::registry::{Layout, Registry, RegistryOptions, RegistryRequest};
use wasm_controller_manager::loading::objects::{fetch, spec};

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.wasm.config.v0+json";

/// How the push subcommand is given its password.
enum Auth<'a> {
    /// `--username U --password-stdin`, this password on stdin.
    Stdin(&'a str),
    /// `--username U`, the password in `WCM_REGISTRY_PASSWORD`.
    Env(&'a str),
    /// `--docker-config FILE`.
    DockerConfig(&'a Path),
    /// No credentials.
    None,
}

struct Run {
    stdout: String,
    stderr: String,
    ok: bool,
}

/// Runs `wasm-controller-manager push ARGS --registry-ca CA` with `auth`.
fn push_cli(registry: &Registry, ca: &Path, args: &[&str], auth: Auth<'_>) -> Result<Run> {
    push_cli_with(registry, Some(ca), args, auth)
}

fn push_cli_with(
    registry: &Registry,
    ca: Option<&Path>,
    args: &[&str],
    auth: Auth<'_>,
) -> Result<Run> {
    use std::io::Write as _;
    let creds = registry
        .credentials()
        .unwrap_or_else(|| testenv::registry::Credentials {
            username: String::new(),
            password: String::new(),
        });
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"));
    cmd.arg("push").args(args);
    if let Some(ca) = ca {
        cmd.arg("--registry-ca").arg(ca);
    }
    cmd.env_remove("WCM_REGISTRY_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut stdin_line = None;
    match auth {
        Auth::Stdin(p) => {
            cmd.args(["--username", &creds.username, "--password-stdin"]);
            stdin_line = Some(format!("{p}\n"));
        }
        Auth::Env(p) => {
            cmd.args(["--username", &creds.username])
                .env("WCM_REGISTRY_PASSWORD", p);
        }
        Auth::DockerConfig(f) => {
            cmd.arg("--docker-config").arg(f);
        }
        Auth::None => {}
    }
    let mut child = cmd.spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    if let Some(line) = stdin_line {
        stdin.write_all(line.as_bytes())?;
    }
    drop(stdin);
    let out = child.wait_with_output()?;
    Ok(Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        ok: out.status.success(),
    })
}

/// `GET /v2/REPO/PATH` with curl (an independent client), as the registry's user.
fn curl(registry: &Registry, ca: &Path, path: &str, accept: &str) -> Result<Vec<u8>> {
    let creds = registry.credentials().context("auth")?;
    let out = Command::new("curl")
        .args(["-sSf", "--cacert"])
        .arg(ca)
        .args(["-u", &format!("{}:{}", creds.username, creds.password)])
        .args(["-H", &format!("Accept: {accept}")])
        .arg(format!("https://{}/v2/{path}", registry.host()))
        .output()?;
    ensure!(
        out.status.success(),
        "curl {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

fn sha256(bytes: &[u8]) -> String {
    wasm_controller_manager::sandbox::sha256_hex(bytes)
}

/// The requests that changed the registry (an upload started or stored, a manifest stored).
fn writes(seen: &[RegistryRequest]) -> Vec<&RegistryRequest> {
    seen.iter()
        .filter(|r| {
            matches!(r.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE") && r.status < 400
        })
        .collect()
}

fn sorted(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

async fn start() -> Result<(Registry, PathBuf, PathBuf)> {
    let registry = Registry::start(RegistryOptions {
        tls: true,
        auth: true,
    })
    .await?;
    let work = temp_dir("push")?;
    let ca = work.join("ca.pem");
    std::fs::write(&ca, registry.ca_pem().context("ca")?)?;
    Ok((registry, work, ca))
}

/// Pushes `name`'s component with the subcommand and checks everything the registry holds and
/// serves for it; returns the printed reference.
async fn push_and_check(registry: &Registry, ca: &Path, name: &str, auth: Auth<'_>) -> Result<()> {
    let file = plugin(name)?;
    let wasm = std::fs::read(&file)?;
    let repo = format!("plugins/{}", name.replace('_', "-"));
    let tag = "1.0.0";
    let target = format!("{}/{repo}:{tag}", registry.host());
    let mark = registry.request_mark()?;
    let run = push_cli(registry, ca, &[&file.display().to_string(), &target], auth)?;
    ensure!(run.ok, "push {name} failed: {}", run.stderr);
    // stdout is exactly the pinned reference.
    let printed = run.stdout.trim_end_matches('\n');
    ensure!(!printed.contains('\n'), "one line: {:?}", run.stdout);
    let digest = printed
        .strip_prefix(&format!("{target}@sha256:"))
        .with_context(|| format!("not {target}@sha256:…: {printed}"))?
        .to_string();

    // What the registry stored, by its own log: the manifest under the tag, as an OCI image
    // manifest, with the digest the registry computed = the printed one; the layer's upload
    // carries the component's digest.
    let seen = registry.requests_since(mark)?;
    let put = seen
        .iter()
        .find(|r| r.method == "PUT" && r.path == format!("/v2/{repo}/manifests/{tag}"))
        .with_context(|| format!("no manifest PUT under the tag: {seen:#?}"))?;
    assert_eq!(put.status, 201, "{put:?}");
    assert_eq!(
        put.digest,
        format!("sha256:{digest}"),
        "the registry's digest"
    );
    let layer_digest = sha256(&wasm);
    assert!(
        seen.iter().any(|r| r.method == "PUT"
            && r.status == 201
            && r.path.starts_with(&format!("/v2/{repo}/blobs/uploads/"))
            && r.digest == format!("sha256:{layer_digest}")),
        "the component stored under its digest (the registry's): {seen:#?}"
    );
    let user = registry.credentials().context("auth")?.username;
    assert!(
        seen.iter()
            .filter(|r| r.status < 400)
            .all(|r| r.auth && r.user == user),
        "every accepted request as the user: {seen:#?}"
    );

    // The manifest read back by tag: its bytes hash to the printed digest.
    let manifest = curl(
        registry,
        ca,
        &format!("{repo}/manifests/{tag}"),
        MANIFEST_TYPE,
    )?;
    assert_eq!(
        sha256(&manifest),
        digest,
        "the printed digest is the manifest's"
    );
    let m: Value = serde_json::from_slice(&manifest)?;
    assert_eq!(m["schemaVersion"], 2);
    assert_eq!(m["mediaType"], MANIFEST_TYPE);
    assert_eq!(m["config"]["mediaType"], CONFIG_TYPE);
    let layers = m["layers"].as_array().context("layers")?;
    assert_eq!(layers.len(), 1, "one layer: {m}");
    assert_eq!(layers[0]["mediaType"], "application/wasm");
    assert_eq!(layers[0]["digest"], format!("sha256:{layer_digest}"));
    assert_eq!(layers[0]["size"], wasm.len());

    // The config: CNCF fields, and the component's top-level names as the Go test tool (its own
    // parser) reads them from the same file.
    let config_digest = m["config"]["digest"].as_str().context("config digest")?;
    let config = curl(
        registry,
        ca,
        &format!("{repo}/blobs/{config_digest}"),
        "*/*",
    )?;
    assert_eq!(format!("sha256:{}", sha256(&config)), config_digest);
    assert_eq!(m["config"]["size"], config.len());
    let c: Value = serde_json::from_slice(&config)?;
    assert_eq!(c["architecture"], "wasm");
    assert_eq!(c["os"], "wasip2");
    assert_eq!(
        c["layerDigests"],
        serde_json::json!([format!("sha256:{layer_digest}")])
    );
    assert!(c["component"].get("target").is_some(), "{c}");
    let theirs = registry
        .push_with(
            &file,
            "plugins/go-tool",
            name,
            Layout::Cncf,
            &Default::default(),
        )
        .await?;
    let go_config: Value = serde_json::from_slice(&curl(
        registry,
        ca,
        &format!("plugins/go-tool/blobs/{}", theirs.config_digest),
        "*/*",
    )?)?;
    for field in ["imports", "exports"] {
        let ours = sorted(&c["component"][field]);
        assert!(!ours.is_empty() || field == "imports", "{field}: {c}");
        assert_eq!(ours, sorted(&go_config["component"][field]), "{field}");
    }
    assert!(
        sorted(&c["component"]["exports"])
            .iter()
            .any(|e| e.starts_with("wcm:reconciler/")),
        "{c}"
    );

    // Pulled back by the host's own pull side, by the printed reference: the same bytes.
    let creds = registry.credentials().context("auth")?;
    let fetcher = fetch::Fetcher::new(
        None,
        64 << 20,
        registry.ca_pem().map(str::as_bytes),
        &[registry.host().to_string()].into(),
        &[],
    )?;
    let origin = spec::Origin::Oci(spec::OciRef::parse(printed).map_err(anyhow::Error::msg)?);
    let fetched = fetcher
        .fetch(
            &origin,
            Some(&fetch::Credentials {
                username: creds.username,
                password: creds.password,
            }),
            &[],
        )
        .await
        .map_err(|e| anyhow::anyhow!("pull back: {} ({})", e.message, e.reason))?;
    assert!(
        fetched.bytes[..] == wasm[..],
        "the bytes pulled back differ"
    );
    assert_eq!(fetched.sha256, layer_digest);
    Ok(())
}

/// A Rust plugin and the 18 MB Python one, pushed with the password on stdin and in the
/// environment: each lands as the CNCF wasm artifact under its tag, the printed digest is the
/// manifest's, and the host pulls back the same bytes.
#[tokio::test(flavor = "multi_thread")]
async fn a_pushed_plugin_is_a_cncf_wasm_artifact_pinned_by_the_printed_digest_and_pulls_back_the_same_bytes()
-> Result<()> {
    let (registry, _work, ca) = start().await?;
    let creds = registry.credentials().context("auth")?;
    push_and_check(&registry, &ca, "well-behaved", Auth::Stdin(&creds.password)).await?;
    push_and_check(
        &registry,
        &ca,
        "config_reloader",
        Auth::Env(&creds.password),
    )
    .await?;
    Ok(())
}

/// `--docker-config` (a `.dockerconfigjson`) and `--plugin NAME --pull-secret S`: the printed
/// object is a Plugin naming the pinned reference and the Secret.
#[tokio::test(flavor = "multi_thread")]
async fn with_plugin_the_output_is_a_plugin_object_naming_the_pinned_reference() -> Result<()> {
    let (registry, work, ca) = start().await?;
    let config = work.join("config.json");
    std::fs::write(&config, registry.dockerconfigjson())?;
    let target = format!("{}/plugins/wb:2", registry.host());
    let run = push_cli(
        &registry,
        &ca,
        &[
            &plugin("well-behaved")?.display().to_string(),
            &target,
            "--plugin",
            "wb",
            "--pull-secret",
            "regcred",
        ],
        Auth::DockerConfig(&config),
    )?;
    ensure!(run.ok, "{}", run.stderr);
    let manifest = curl(&registry, &ca, "plugins/wb/manifests/2", MANIFEST_TYPE)?;
    let expected = format!(
        "apiVersion: wcm.dev/v1alpha1\nkind: Plugin\nmetadata:\n  name: wb\nspec:\n  source:\n    oci: {target}@sha256:{}\n  pullSecret: regcred\n",
        sha256(&manifest)
    );
    assert_eq!(run.stdout, expected);
    // The object is one the source parser accepts.
    spec::OciRef::parse(&format!("{target}@sha256:{}", sha256(&manifest)))
        .map_err(anyhow::Error::msg)?;
    Ok(())
}

/// A core module, junk, a file over `--max-plugin-bytes`: refused with a clear one-line error
/// before the registry is asked anything. A wrong password: refused by the registry, said
/// clearly, never echoed, nothing stored.
#[tokio::test(flavor = "multi_thread")]
async fn push_refuses_a_core_module_junk_an_oversize_file_and_a_wrong_password_with_nothing_stored()
-> Result<()> {
    let (registry, work, ca) = start().await?;
    let creds = registry.credentials().context("auth")?;
    let core = work.join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0")?;
    let junk = work.join("junk.wasm");
    std::fs::write(&junk, b"#!/bin/sh\necho not wasm\n")?;
    let wb = plugin("well-behaved")?.display().to_string();
    let target = format!("{}/plugins/refused:1", registry.host());
    let mark = registry.request_mark()?;
    let one_line = |r: &Run| r.stderr.trim_end().lines().count() == 1;

    let r = push_cli(
        &registry,
        &ca,
        &[&core.display().to_string(), &target],
        Auth::Stdin(&creds.password),
    )?;
    assert!(!r.ok && r.stdout.is_empty(), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("core WebAssembly module, not a component")
            && one_line(&r),
        "{}",
        r.stderr
    );
    let r = push_cli(
        &registry,
        &ca,
        &[&junk.display().to_string(), &target],
        Auth::Stdin(&creds.password),
    )?;
    assert!(!r.ok && r.stdout.is_empty(), "{}", r.stderr);
    assert!(
        r.stderr.contains("not a WebAssembly binary") && one_line(&r),
        "{}",
        r.stderr
    );
    let r = push_cli(
        &registry,
        &ca,
        &[&wb, &target, "--max-plugin-bytes", "1000"],
        Auth::Stdin(&creds.password),
    )?;
    assert!(!r.ok && r.stdout.is_empty(), "{}", r.stderr);
    assert!(
        r.stderr.contains("more than --max-plugin-bytes (1000)") && one_line(&r),
        "{}",
        r.stderr
    );
    assert_eq!(
        registry.requests_since(mark)?,
        Vec::new(),
        "the registry was asked nothing"
    );

    let wrong = "not-the-password-Xq7";
    let r = push_cli(&registry, &ca, &[&wb, &target], Auth::Stdin(wrong))?;
    assert!(!r.ok && r.stdout.is_empty(), "{}", r.stderr);
    assert!(
        r.stderr.contains("Unauthorized") && r.stderr.contains("401") && one_line(&r),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains(wrong) && !r.stderr.contains(&creds.password),
        "{}",
        r.stderr
    );
    let seen = registry.requests_since(mark)?;
    assert!(!seen.is_empty(), "the registry was asked");
    assert!(
        seen.iter().all(|r| r.status == 401),
        "every request refused: {seen:#?}"
    );
    assert!(writes(&seen).is_empty(), "{seen:#?}");
    // Nothing under the tag.
    assert!(curl(&registry, &ca, "plugins/refused/manifests/1", MANIFEST_TYPE).is_err());
    Ok(())
}

/// A registry without TLS is reached only with `--plain-http`: without it the push fails (TLS to
/// a plain port) and nothing is stored; with it the manifest lands under the tag.
#[tokio::test(flavor = "multi_thread")]
async fn plain_http_is_used_only_when_asked_for() -> Result<()> {
    let registry = Registry::start(RegistryOptions {
        tls: false,
        auth: false,
    })
    .await?;
    let wb = plugin("well-behaved")?.display().to_string();
    let target = format!("{}/plugins/plain:1", registry.host());
    let mark = registry.request_mark()?;
    let r = push_cli_with(&registry, None, &[&wb, &target], Auth::None)?;
    assert!(!r.ok && r.stdout.is_empty(), "{}", r.stderr);
    assert!(
        r.stderr.trim_end().lines().count() == 1,
        "one line: {}",
        r.stderr
    );
    assert!(writes(&registry.requests_since(mark)?).is_empty());
    let r = push_cli_with(&registry, None, &[&wb, &target, "--plain-http"], Auth::None)?;
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stdout.starts_with(&format!("{target}@sha256:")),
        "{}",
        r.stdout
    );
    let seen = registry.requests_since(mark)?;
    assert!(
        seen.iter().any(|q| q.method == "PUT"
            && q.path == "/v2/plugins/plain/manifests/1"
            && q.status == 201
            && r.stdout.trim_end().ends_with(&q.digest)),
        "{seen:#?}"
    );
    Ok(())
}
