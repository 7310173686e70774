//! Every way a Plugin's pull can fail refuses that one Plugin with a clear reason on its status and
//! touches nothing else: a real OCI registry (CNCF distribution, TLS from its own CA, basic auth)
//! and the real API server, judged by the Plugin's conditions, the registry's own request log and
//! the writes of the plugin that keeps running beside them. A restart while the registry is down
//! runs what the disk cache holds.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use common::objects::{condition, install_crd};
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::registry::{Broken, Layout, Registry, RegistryOptions, RegistryRequest};
use wasm_controller_manager::app::Manager;
use wasm_controller_manager::loading::objects::{self, ObjectSettings};
use wasm_controller_manager::loading::plugins::FileStatus;

const IDENTITY_NS: &str = "wcm-system";
/// The cap on a component in this test (`--max-plugin-bytes`).
const MAX_BYTES: usize = 4 << 20;
/// The cap on the components of all Plugins together (`--plugin-objects-max-total-mb`): room for
/// the small ones below, not for one more of 2 MiB.
const MAX_TOTAL: usize = 2 << 20;

/// A custom section named `name` holding `len` zero bytes (a component with it appended is the
/// same component, other bytes).
fn custom_section(name: &str, len: usize) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    let mut payload = Vec::new();
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name.as_bytes());
    payload.resize(payload.len() + len, 0);
    let mut out = vec![0];
    leb(payload.len(), &mut out);
    out.extend(payload);
    out
}

fn object(name: &str, reference: &str, pull_secret: Option<&str>) -> Result<DynamicObject> {
    signed_object(name, reference, pull_secret, &[])
}

/// A Plugin asking for a cosign signature by one of `keys` (PEM).
fn signed_object(
    name: &str,
    reference: &str,
    pull_secret: Option<&str>,
    keys: &[String],
) -> Result<DynamicObject> {
    let mut o = json!({
        "apiVersion": "wcm.dev/v1alpha1", "kind": "Plugin",
        "metadata": {"name": name},
        "spec": {"source": {"oci": reference}},
    });
    if let Some(s) = pull_secret {
        o["spec"]["pullSecret"] = s.into();
    }
    if !keys.is_empty() {
        o["spec"]["verify"] = json!({"publicKeys": keys});
    }
    Ok(serde_json::from_value(o)?)
}

/// A pull Secret for the Plugins `plugins` names (its `wcm.dev/plugins` annotation; none: no
/// annotation).
async fn docker_secret(
    client: &kube::Client,
    name: &str,
    config: &str,
    plugins: Option<&str>,
) -> Result<()> {
    ensure_namespace(client, IDENTITY_NS).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), IDENTITY_NS);
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "annotations": plugins.map(|p| json!({"wcm.dev/plugins": p}))},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config},
    }))?;
    secrets
        .patch(
            name,
            &PatchParams::apply("plugin-registry-failures").force(),
            &Patch::Apply(&s),
        )
        .await?;
    Ok(())
}

/// Waits until the Plugin's condition `t` has `status` and `reason`; returns the object.
async fn wait_condition(
    plugins: &Api<DynamicObject>,
    name: &str,
    t: &str,
    status: &str,
    reason: &str,
) -> Result<DynamicObject> {
    let what = format!("{name}: {t} {status} {reason}");
    let found = eventually(&what, Duration::from_secs(60), || async {
        let o = plugins.get(name).await?;
        Ok(condition(&o, t)
            .is_some_and(|c| c["status"] == status && c["reason"] == reason)
            .then_some(o))
    })
    .await;
    if found.is_err()
        && let Ok(o) = plugins.get(name).await
    {
        println!("{name} status: {:#}", o.data["status"]);
    }
    let o = found?;
    println!(
        "{name}: {t} {status} {reason}: {}",
        condition(&o, t)
            .map(|c| c["message"].clone())
            .unwrap_or_default()
    );
    Ok(o)
}

fn in_repo<'a>(requests: &'a [RegistryRequest], repo: &str) -> Vec<&'a RegistryRequest> {
    requests
        .iter()
        .filter(|r| r.path.starts_with(&format!("/v2/{repo}/")))
        .collect()
}

fn blob_gets(requests: &[&RegistryRequest]) -> usize {
    requests
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/blobs/"))
        .count()
}

fn settings(registry: &Registry, cache: &Path) -> Result<ObjectSettings> {
    Ok(ObjectSettings {
        registries: [registry.host().to_string()].into(),
        plain_http: Vec::new(),
        ca_pem: Some(
            registry
                .ca_pem()
                .context("a TLS registry has a CA")?
                .as_bytes()
                .to_vec(),
        ),
        cache: Some(cache.to_path_buf()),
        max_bytes: MAX_BYTES,
        max_total_bytes: MAX_TOTAL,
        secrets_namespace: IDENTITY_NS.into(),
        ceilings: Default::default(),
        required_keys: None,
    })
}

async fn start(dir: &Path, registry: &Registry, cache: &Path) -> Result<Manager> {
    let mut cfg = test_config(dir);
    cfg.max_plugin_bytes = MAX_BYTES as u64;
    cfg.plugin_objects = Some(settings(registry, cache)?);
    start_manager(cfg).await
}

/// The plugin that keeps running beside the failures still reconciles a new change.
async fn still_reconciles(cms: &Api<ConfigMap>, name: &str) -> Result<()> {
    create_and_wait_reconciled(cms, name, name).await
}

#[tokio::test(flavor = "multi_thread")]
async fn each_failed_pull_refuses_only_its_plugin_and_a_restart_in_an_outage_runs_the_cache()
-> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("wasm_controller_manager=info")
        .with_test_writer()
        .try_init();
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    install_crd(&client).await?;
    let registry = Registry::start(RegistryOptions {
        tls: true,
        auth: true,
    })
    .await?;
    docker_secret(&client, "regcred", &registry.dockerconfigjson(), Some("*")).await?;
    // Right credentials, but for other Plugins only.
    docker_secret(
        &client,
        "teamb-regcred",
        &registry.dockerconfigjson(),
        Some("team-b-one, team-b-two"),
    )
    .await?;
    let wrong = registry.dockerconfigjson().replace(
        &registry.credentials().context("auth")?.password,
        "not-the-password",
    );
    docker_secret(&client, "wrongcred", &wrong, Some("*")).await?;
    let plugins: Api<DynamicObject> = Api::all_with(client.clone(), &objects::resource());
    const NAMES: [&str; 16] = [
        "well-behaved",
        "no-secret",
        "missing-secret",
        "wrong-password",
        "other-teams-secret",
        "unknown-digest",
        "corrupt-layer",
        "too-large",
        "longer-than-declared",
        "tar-layer",
        "core-module",
        "other-world",
        "over-budget",
        "signed",
        "signed-by-another-key",
        "unsigned",
    ];
    for n in NAMES {
        let _ = plugins.delete(n, &DeleteParams::default()).await;
    }

    let wb = plugin("well-behaved")?;
    grant(std::slice::from_ref(&wb)).await?;
    let pushed = |repo: &'static str, path: std::path::PathBuf, broken: Broken| {
        let registry = &registry;
        async move {
            registry
                .push_with(&path, repo, "1", Layout::Cncf, &broken)
                .await
        }
    };
    let good = pushed("plugins/well-behaved", wb.clone(), Broken::default()).await?;
    let work = temp_dir("registry-failures")?;
    let core = work.join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0")?;

    let dir = temp_dir("registry-failures-plugins")?;
    let cache = temp_dir("registry-failures-cache")?;
    let manager = start(&dir, &registry, &cache).await?;
    let ns = env.namespace("registry-failures").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);

    // The plugin that runs beside every failure.
    plugins
        .create(
            &PostParams::default(),
            &object("well-behaved", &good.reference, Some("regcred"))?,
        )
        .await?;
    wait_condition(&plugins, "well-behaved", "Ready", "True", "Running").await?;
    still_reconciles(&cms, "before").await?;

    let create = |name: &'static str, reference: String, secret: Option<&'static str>| {
        let plugins = plugins.clone();
        async move {
            plugins
                .create(&PostParams::default(), &object(name, &reference, secret)?)
                .await?;
            anyhow::Ok(())
        }
    };

    // No pull Secret for a registry that asks for credentials: Unauthorized, nothing downloaded.
    let mark = registry.request_mark()?;
    create("no-secret", good.reference.clone(), None).await?;
    wait_condition(&plugins, "no-secret", "Pulled", "False", "Unauthorized").await?;
    // A pull Secret that does not exist: said, and the registry is not asked.
    create("missing-secret", good.reference.clone(), Some("nope")).await?;
    wait_condition(
        &plugins,
        "missing-secret",
        "Pulled",
        "False",
        "PullSecretMissing",
    )
    .await?;
    // A wrong password: Unauthorized.
    create("wrong-password", good.reference.clone(), Some("wrongcred")).await?;
    wait_condition(
        &plugins,
        "wrong-password",
        "Pulled",
        "False",
        "Unauthorized",
    )
    .await?;
    // Another team's pull Secret (right credentials, not for this Plugin): refused, the
    // registry not asked with it.
    create(
        "other-teams-secret",
        good.reference.clone(),
        Some("teamb-regcred"),
    )
    .await?;
    wait_condition(
        &plugins,
        "other-teams-secret",
        "Pulled",
        "False",
        "PullSecretInvalid",
    )
    .await?;
    let seen = registry.requests_since(mark)?;
    let repo = in_repo(&seen, "plugins/well-behaved");
    assert_eq!(blob_gets(&repo), 0, "nothing downloaded: {repo:#?}");
    assert!(
        repo.iter().all(|r| r.status == 401),
        "every request refused: {repo:#?}"
    );
    assert!(!repo.is_empty(), "the registry was asked");

    // A digest the registry does not have: NotFound.
    let unknown = format!(
        "{}/plugins/well-behaved@sha256:{}",
        registry.host(),
        wasm_controller_manager::sandbox::sha256_hex(b"no such manifest")
    );
    create("unknown-digest", unknown, Some("regcred")).await?;
    wait_condition(&plugins, "unknown-digest", "Pulled", "False", "NotFound").await?;

    // A layer whose bytes are not what the manifest names: DigestMismatch.
    let corrupt = pushed(
        "plugins/corrupt",
        wb.clone(),
        Broken {
            corrupt_layer: true,
            ..Default::default()
        },
    )
    .await?;
    create("corrupt-layer", corrupt.reference.clone(), Some("regcred")).await?;
    wait_condition(
        &plugins,
        "corrupt-layer",
        "Pulled",
        "False",
        "DigestMismatch",
    )
    .await?;

    // Too large, by the manifest: refused before the layer is asked for.
    let mark = registry.request_mark()?;
    let huge = pushed(
        "plugins/huge",
        wb.clone(),
        Broken {
            huge_layer: Some(MAX_BYTES as u64 + 1),
            ..Default::default()
        },
    )
    .await?;
    create("too-large", huge.reference.clone(), Some("regcred")).await?;
    wait_condition(&plugins, "too-large", "Pulled", "False", "TooLarge").await?;
    let seen = registry.requests_since(mark)?;
    assert_eq!(
        blob_gets(&in_repo(&seen, "plugins/huge")),
        0,
        "the layer was never asked for"
    );
    // A layer longer than its manifest says (bytes no other Plugin pulled, so they are
    // downloaded): cut at the declared size.
    let mut lying_bytes = std::fs::read(&wb)?;
    lying_bytes.extend_from_slice(&[0, 7, 3, b'l', b'i', b'e', 1, 2, 3]);
    let lying_wasm = work.join("lying.wasm");
    std::fs::write(&lying_wasm, &lying_bytes)?;
    let lying = pushed(
        "plugins/lying",
        lying_wasm,
        Broken {
            claim_layer_size: Some(1000),
            ..Default::default()
        },
    )
    .await?;
    create(
        "longer-than-declared",
        lying.reference.clone(),
        Some("regcred"),
    )
    .await?;
    wait_condition(
        &plugins,
        "longer-than-declared",
        "Pulled",
        "False",
        "DigestMismatch",
    )
    .await?;

    // Not a wasm artifact (a tar layer): refused from the manifest.
    let mark = registry.request_mark()?;
    let tar = pushed(
        "plugins/tar",
        wb.clone(),
        Broken {
            layer_media_type: Some("application/vnd.oci.image.layer.v1.tar".into()),
            ..Default::default()
        },
    )
    .await?;
    create("tar-layer", tar.reference.clone(), Some("regcred")).await?;
    wait_condition(&plugins, "tar-layer", "Pulled", "False", "NotAWasmArtifact").await?;
    assert_eq!(
        blob_gets(&in_repo(&registry.requests_since(mark)?, "plugins/tar")),
        0
    );
    // Not a component (a core module), and a component of another world: pulled, then refused
    // by the loader as a file of the directory would be.
    let core_ref = pushed("plugins/core", core.clone(), Broken::default())
        .await?
        .reference;
    create("core-module", core_ref, Some("regcred")).await?;
    let o = wait_condition(&plugins, "core-module", "Ready", "False", "Refused").await?;
    assert_eq!(condition(&o, "Pulled").context("Pulled")?["status"], "True");
    let other_ref = pushed(
        "plugins/other-world",
        plugin("not-a-plugin")?,
        Broken::default(),
    )
    .await?
    .reference;
    create("other-world", other_ref, Some("regcred")).await?;
    wait_condition(&plugins, "other-world", "Ready", "False", "Refused").await?;

    // Over the memory for all Plugins' components together: waits, said on its status.
    let mut big = std::fs::read(&wb)?;
    big.extend(custom_section("pad", 2 << 20));
    let big_wasm = work.join("big.wasm");
    std::fs::write(&big_wasm, &big)?;
    let big_ref = pushed("plugins/big", big_wasm, Broken::default())
        .await?
        .reference;
    create("over-budget", big_ref, Some("regcred")).await?;
    wait_condition(&plugins, "over-budget", "Pulled", "False", "OverBudget").await?;

    // Signatures (cosign's own, made with keys it generated): a Plugin asking for one of the
    // operator's keys runs only an artifact signed by it, checked before the layer is asked for.
    let (key, public) = testenv::registry::cosign_key_pair(&work.join("operator-key"))?;
    let (_, stranger) = testenv::registry::cosign_key_pair(&work.join("another-key"))?;
    let mut signed_bytes = std::fs::read(&wb)?;
    signed_bytes.extend_from_slice(&[0, 7, 3, b's', b'i', b'g', 1, 2, 3]);
    let signed_wasm = work.join("signed.wasm");
    std::fs::write(&signed_wasm, &signed_bytes)?;
    let signed = pushed("plugins/signed", signed_wasm.clone(), Broken::default()).await?;
    registry.cosign_sign(&signed.reference, &key)?;
    let unsigned = pushed("plugins/unsigned", signed_wasm, Broken::default()).await?;
    let layer = signed.layer_digests[0].clone();
    let mark = registry.request_mark()?;
    plugins
        .create(
            &PostParams::default(),
            &signed_object(
                "signed-by-another-key",
                &signed.reference,
                Some("regcred"),
                std::slice::from_ref(&stranger),
            )?,
        )
        .await?;
    wait_condition(
        &plugins,
        "signed-by-another-key",
        "Verified",
        "False",
        "SignatureInvalid",
    )
    .await?;
    plugins
        .create(
            &PostParams::default(),
            &signed_object(
                "unsigned",
                &unsigned.reference,
                Some("regcred"),
                std::slice::from_ref(&public),
            )?,
        )
        .await?;
    wait_condition(
        &plugins,
        "unsigned",
        "Verified",
        "False",
        "SignatureMissing",
    )
    .await?;
    let seen = registry.requests_since(mark)?;
    assert!(
        seen.iter()
            .any(|r| r.path.ends_with(".sig") && r.path.contains("/manifests/")),
        "the signature was asked for: {seen:#?}"
    );
    assert!(
        !seen
            .iter()
            .any(|r| r.path.ends_with(&format!("/blobs/{layer}"))),
        "the layer was never downloaded for an unverified artifact: {seen:#?}"
    );
    plugins
        .create(
            &PostParams::default(),
            &signed_object(
                "signed",
                &signed.reference,
                Some("regcred"),
                &[stranger.clone(), public.clone()],
            )?,
        )
        .await?;
    let o = wait_condition(&plugins, "signed", "Verified", "True", "Verified").await?;
    assert_eq!(condition(&o, "Pulled").context("Pulled")?["status"], "True");
    assert!(
        condition(&o, "Verified").context("Verified")?["message"]
            .as_str()
            .is_some_and(|m| m.contains("publicKeys[1]")),
        "the second key signed it"
    );

    // Through all of it, the running plugin kept running and reconciling.
    assert!(
        matches!(
            status_of(&manager, "Plugin/well-behaved").await,
            Some(FileStatus::Running { .. })
        ),
        "the running plugin kept running"
    );
    still_reconciles(&cms, "after-failures").await?;

    // The registry down: a new digest for the running plugin cannot be pulled; the version
    // already running keeps running, the condition says why, and it is retried.
    let mut wb2_bytes = std::fs::read(&wb)?;
    wb2_bytes.extend_from_slice(&[0, 8, 4, b'w', b'c', b'm', b'2', 1, 2, 3]);
    let wb2 = work.join("well-behaved-2.wasm");
    std::fs::write(&wb2, &wb2_bytes)?;
    let second = pushed("plugins/well-behaved", wb2.clone(), Broken::default()).await?;
    registry.stop()?;
    plugins
        .patch(
            "well-behaved",
            &PatchParams::apply("plugin-registry-failures").force(),
            &Patch::Apply(json!({
                "apiVersion": "wcm.dev/v1alpha1", "kind": "Plugin",
                "spec": {"source": {"oci": second.reference}, "pullSecret": "regcred"},
            })),
        )
        .await?;
    wait_condition(&plugins, "well-behaved", "Pulled", "False", "Unreachable").await?;
    let first_sha = wasm_controller_manager::sandbox::sha256_hex(&std::fs::read(&wb)?);
    assert!(
        matches!(status_of(&manager, "Plugin/well-behaved").await, Some(FileStatus::Running { sha256, .. }) if sha256 == first_sha),
        "the running version keeps running while the registry is down"
    );
    still_reconciles(&cms, "during-outage").await?;
    // Back: retried with backoff, and the new version runs.
    registry.resume()?;
    let second_sha = wasm_controller_manager::sandbox::sha256_hex(&wb2_bytes);
    wait_status_within(
        &manager,
        "Plugin/well-behaved",
        "the new version once the registry is back",
        Duration::from_secs(60),
        |s| matches!(s, FileStatus::Running { sha256, .. } if *sha256 == second_sha),
    )
    .await?;

    // A restart while the registry is down runs what the disk cache holds.
    for n in &NAMES[1..] {
        plugins.delete(n, &DeleteParams::default()).await?;
    }
    manager.stop().await;
    registry.stop()?;
    let manager = start(&dir, &registry, &cache).await?;
    wait_status_within(
        &manager,
        "Plugin/well-behaved",
        "running from the disk cache",
        Duration::from_secs(60),
        |s| matches!(s, FileStatus::Running { sha256, .. } if *sha256 == second_sha),
    )
    .await?;
    wait_condition(&plugins, "well-behaved", "Pulled", "True", "FromCache").await?;
    still_reconciles(&cms, "after-restart").await?;
    // And with the registry up, a restart asks it nothing either (what a stopped registry
    // cannot show: it logs no refused connection).
    manager.stop().await;
    registry.resume()?;
    let mark = registry.request_mark()?;
    let manager = start(&dir, &registry, &cache).await?;
    wait_status_within(
        &manager,
        "Plugin/well-behaved",
        "running from the disk cache, the registry up",
        Duration::from_secs(60),
        |s| matches!(s, FileStatus::Running { sha256, .. } if *sha256 == second_sha),
    )
    .await?;
    still_reconciles(&cms, "after-second-restart").await?;
    assert_eq!(
        registry.requests_since(mark)?,
        Vec::new(),
        "the cache served it without the registry"
    );
    plugins
        .delete("well-behaved", &DeleteParams::default())
        .await?;
    manager.stop().await;
    Ok(())
}
