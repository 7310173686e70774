//! Plugins as cluster objects (`plugins.wcm.dev`), against the real API server: a Plugin whose
//! component is fetched over https (a real TLS server on loopback with a certificate of the
//! cluster's CA, which the host is told to trust) starts without a restart, acts, reports its
//! status on the object, keeps running when a new source cannot be used (wrong digest, a host not
//! allowed), swaps to a new digest, and stops when the object is deleted.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use common::objects::{condition, install_crd};
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_rustls::rustls;
use wasm_controller_manager::loading::objects::{self, ObjectSettings};
use wasm_controller_manager::loading::plugins::FileStatus;

/// Files served over https, and the paths asked for.
#[derive(Default)]
struct Files {
    by_path: BTreeMap<String, Vec<u8>>,
    asked: Vec<String>,
}

/// An https server on 127.0.0.1 with the apiserver's serving certificate (valid for 127.0.0.1,
/// signed by the cluster CA): `GET /PATH` answers the bytes stored under PATH, else 404.
async fn serve_files(pki: &Path, files: Arc<Mutex<Files>>) -> Result<u16> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(pki.join("apiserver.crt"))?.collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(pki.join("apiserver.key"))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, files) = (acceptor.clone(), files.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut stream = BufReader::new(tls);
                let mut request = String::new();
                if stream.read_line(&mut request).await.is_err() {
                    return;
                }
                let mut line = String::new();
                while stream.read_line(&mut line).await.is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = request
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                let body = {
                    let mut f = files.lock().expect("not poisoned");
                    f.asked.push(path.clone());
                    f.by_path.get(&path).cloned()
                };
                let (status, body) = match body {
                    Some(b) => ("200 OK", b),
                    None => ("404 Not Found", Vec::new()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/wasm\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let s = stream.get_mut();
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Ok(port)
}

fn plugin_object(name: &str, url: &str, sha256: &str) -> Value {
    json!({
        "apiVersion": "wcm.dev/v1alpha1", "kind": "Plugin",
        "metadata": {"name": name},
        "spec": {"source": {"https": {"url": url, "sha256": sha256}}},
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_object_is_fetched_runs_keeps_running_through_bad_sources_swaps_and_stops()
-> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("wasm_controller_manager=info")
        .with_test_writer()
        .try_init();
    let env = testenv::TestEnv::shared().await?;
    let Some(local) = env.local() else {
        eprintln!("skipped: the file server uses the local cluster's serving certificate");
        return Ok(());
    };
    let client = env.client().await?;
    install_crd(&client).await?;
    let pki = Path::new(&local.dir).join("pki");
    let files = Arc::new(Mutex::new(Files::default()));
    let port = serve_files(&pki, files.clone()).await?;
    let base = format!("https://127.0.0.1:{port}");

    let wb_path = plugin("well-behaved")?;
    let wb = std::fs::read(&wb_path)?;
    let wb_sha = wasm_controller_manager::sandbox::sha256_hex(&wb);
    // The same plugin, other bytes (a custom section appended): a new version.
    let mut wb2 = wb.clone();
    wb2.extend_from_slice(&[0, 8, 4, b'w', b'c', b'm', b'2', 1, 2, 3]);
    let wb2_sha = wasm_controller_manager::sandbox::sha256_hex(&wb2);
    {
        let mut f = files.lock().expect("not poisoned");
        f.by_path.insert("/wb.wasm".into(), wb.clone());
        f.by_path.insert("/wb2.wasm".into(), wb2.clone());
    }
    grant(std::slice::from_ref(&wb_path)).await?;

    let dir = temp_dir("plugin-objects")?;
    let cache = temp_dir("plugin-objects-cache")?;
    let mut cfg = test_config(&dir);
    cfg.plugin_objects = Some(ObjectSettings {
        registries: [format!("127.0.0.1:{port}")].into(),
        plain_http: Vec::new(),
        ca_pem: Some(std::fs::read(pki.join("ca.crt"))?),
        cache: Some(cache.clone()),
        max_bytes: 64 << 20,
        max_total_bytes: 256 << 20,
        secrets_namespace: "wcm-system".into(),
        ceilings: Default::default(),
        required_keys: None,
    });
    let manager = start_manager(cfg).await?;
    let plugins: Api<DynamicObject> = Api::all_with(client.clone(), &objects::resource());
    let _ = plugins
        .delete("well-behaved", &DeleteParams::default())
        .await;

    // Created: fetched, checked, loaded like a file, running.
    plugins
        .create(
            &PostParams::default(),
            &serde_json::from_value(plugin_object(
                "well-behaved",
                &format!("{base}/wb.wasm"),
                &wb_sha,
            ))?,
        )
        .await?;
    wait_status(
        &manager,
        "Plugin/well-behaved",
        "the Plugin running",
        |s| matches!(s, FileStatus::Running { sha256, .. } if *sha256 == wb_sha),
    )
    .await?;
    // It acts.
    let ns = env.namespace("plugin-objects").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    create_and_wait_reconciled(&cms, "one", "1").await?;
    // Its status, on the object, as kubectl shows it.
    let o = eventually(
        "the Plugin's status Ready",
        Duration::from_secs(30),
        || async {
            let o = plugins.get("well-behaved").await?;
            Ok(condition(&o, "Ready")
                .is_some_and(|c| c["status"] == "True")
                .then_some(o))
        },
    )
    .await?;
    assert_eq!(o.data["status"]["digest"], format!("sha256:{wb_sha}"));
    assert_eq!(condition(&o, "Pulled").context("Pulled")?["status"], "True");
    let replicas = o.data["status"]["replicas"]
        .as_array()
        .context("replicas")?;
    assert_eq!(replicas.len(), 1, "{replicas:?}");
    assert_eq!(replicas[0]["state"], "running");

    // A wrong digest (of bytes not in the cache, so the file is fetched and checked): refused on
    // the status, the running version keeps running.
    let other_sha = wasm_controller_manager::sandbox::sha256_hex(b"not the served bytes");
    let patch = |url: String, sha: String| {
        json!({"apiVersion": "wcm.dev/v1alpha1", "kind": "Plugin",
               "spec": {"source": {"https": {"url": url, "sha256": sha}}}})
    };
    plugins
        .patch(
            "well-behaved",
            &PatchParams::apply("plugin-objects-test").force(),
            &Patch::Apply(patch(format!("{base}/wb2.wasm"), other_sha)),
        )
        .await?;
    let o = eventually(
        "Pulled False: DigestMismatch",
        Duration::from_secs(30),
        || async {
            let o = plugins.get("well-behaved").await?;
            Ok(condition(&o, "Pulled")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "DigestMismatch")
                .then_some(o))
        },
    )
    .await?;
    eprintln!(
        "wrong digest: {}",
        condition(&o, "Pulled").context("Pulled")?["message"]
    );
    assert!(
        matches!(status_of(&manager, "Plugin/well-behaved").await, Some(FileStatus::Running { sha256, .. }) if sha256 == wb_sha),
        "the running version keeps running"
    );
    // A host that is not allowed: refused before any request.
    let asked_before = files.lock().expect("not poisoned").asked.len();
    plugins
        .patch(
            "well-behaved",
            &PatchParams::apply("plugin-objects-test").force(),
            // The same file server under a name not in --plugin-registry.
            &Patch::Apply(patch(
                format!("https://localhost:{port}/wb.wasm"),
                wb_sha.clone(),
            )),
        )
        .await?;
    eventually(
        "Pulled False: not allowed",
        Duration::from_secs(30),
        || async {
            let o = plugins.get("well-behaved").await?;
            Ok(condition(&o, "Pulled")
                .is_some_and(|c| {
                    c["status"] == "False"
                        && c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("not in --plugin-registry"))
                })
                .then_some(()))
        },
    )
    .await?;
    assert!(
        matches!(status_of(&manager, "Plugin/well-behaved").await, Some(FileStatus::Running { sha256, .. }) if sha256 == wb_sha),
        "the running version keeps running"
    );

    // A new digest: swapped in place, no restart of the host.
    plugins
        .patch(
            "well-behaved",
            &PatchParams::apply("plugin-objects-test").force(),
            &Patch::Apply(patch(format!("{base}/wb2.wasm"), wb2_sha.clone())),
        )
        .await?;
    wait_status(
        &manager,
        "Plugin/well-behaved",
        "the new digest running",
        |s| matches!(s, FileStatus::Running { sha256, .. } if *sha256 == wb2_sha),
    )
    .await?;
    let asked: Vec<String> = files.lock().expect("not poisoned").asked[asked_before..].to_vec();
    assert_eq!(
        asked,
        vec!["/wb2.wasm".to_string()],
        "the disallowed host was never asked; the new digest was fetched once"
    );
    cms.patch(
        "one",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "2"}})),
    )
    .await?;
    eventually(
        "the new version reconciles",
        Duration::from_secs(30),
        || async {
            Ok(reconciled_annotations(&cms)
                .await?
                .get("one")
                .is_some_and(|v| v == "2")
                .then_some(()))
        },
    )
    .await?;
    // The fetched components are in the cache, by digest.
    assert!(
        cache
            .join("https")
            .join(format!("{wb2_sha}.wasm"))
            .is_file()
    );

    // Deleted: the plugin stops.
    plugins
        .delete("well-behaved", &DeleteParams::default())
        .await?;
    eventually("the plugin stopped", Duration::from_secs(30), || async {
        Ok(status_of(&manager, "Plugin/well-behaved")
            .await
            .is_none()
            .then_some(()))
    })
    .await?;
    manager.stop().await;
    Ok(())
}

/// Writing a Plugin runs code as the plugin it names, and RBAC cannot limit `create` by name: the
/// admission policy of `manifests/admission/` asks for the verb `run` on that very name. A user
/// allowed to create Plugins and to run `team-a-reloader` is refused, by the API server, a Plugin
/// named after another plugin, and may write its own.
#[tokio::test(flavor = "multi_thread")]
async fn writing_a_plugin_needs_the_run_verb_on_its_name() -> Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    install_crd(&client).await?;
    let text = std::fs::read_to_string(
        testenv::repo_root().join("manifests/admission/plugin-names.yaml"),
    )?;
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc)?;
        let o: DynamicObject = serde_json::from_value(v.clone())?;
        let gvk = kube::core::GroupVersionKind::try_from(o.types.as_ref().context("types")?)?;
        let api: Api<DynamicObject> =
            Api::all_with(client.clone(), &kube::core::ApiResource::from_gvk(&gvk));
        api.patch(
            o.metadata.name.as_deref().context("name")?,
            &PatchParams::apply("plugin-objects-test").force(),
            &Patch::Apply(&v),
        )
        .await?;
    }
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "wcm-test:team-a-plugins"},
        "rules": [
            {"apiGroups": ["wcm.dev"], "resources": ["plugins"], "verbs": ["get", "create", "update", "patch", "delete"]},
            {"apiGroups": ["wcm.dev"], "resources": ["plugins"], "verbs": ["run"], "resourceNames": ["team-a-reloader"]},
        ],
    }))?;
    Api::<ClusterRole>::all(client.clone())
        .patch(
            "wcm-test:team-a-plugins",
            &PatchParams::apply("plugin-objects-test").force(),
            &Patch::Apply(&role),
        )
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "wcm-test:team-a-plugins"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "wcm-test:team-a-plugins"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "team-a-dev"}],
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            "wcm-test:team-a-plugins",
            &PatchParams::apply("plugin-objects-test").force(),
            &Patch::Apply(&binding),
        )
        .await?;
    let mut as_dev = host_config().await?;
    as_dev.auth_info.impersonate = Some("team-a-dev".into());
    let dev = kube::Client::try_from(as_dev)?;
    let theirs: Api<DynamicObject> = Api::all_with(dev, &objects::resource());
    let ours: Api<DynamicObject> = Api::all_with(client.clone(), &objects::resource());
    for n in ["team-a-reloader", "someone-elses"] {
        let _ = ours.delete(n, &DeleteParams::default()).await;
    }
    let sha = "0".repeat(64);
    let object = |name: &str| -> Result<DynamicObject> {
        Ok(serde_json::from_value(plugin_object(
            name,
            "https://files.example/x.wasm",
            &sha,
        ))?)
    };
    // Refused once the policy is in force (the API server loads it within seconds).
    let refusal = eventually(
        "a Plugin of another name refused",
        Duration::from_secs(30),
        || async {
            match theirs
                .create(&PostParams::default(), &object("someone-elses")?)
                .await
            {
                Ok(_) => {
                    // Not yet in force: take it back and try again.
                    ours.delete("someone-elses", &DeleteParams::default())
                        .await?;
                    Ok(None)
                }
                Err(kube::Error::Api(e)) => Ok(Some(e)),
                Err(e) => Err(e.into()),
            }
        },
    )
    .await?;
    println!("refused: {} {}", refusal.code, refusal.message);
    assert_eq!(refusal.code, 403, "{refusal:?}");
    assert!(
        refusal.message.contains("needs the verb run"),
        "{}",
        refusal.message
    );
    assert!(ours.get_opt("someone-elses").await?.is_none(), "not stored");
    // Its own name: allowed, and so is an update.
    theirs
        .create(&PostParams::default(), &object("team-a-reloader")?)
        .await?;
    theirs
        .patch(
            "team-a-reloader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"https": {"url": "https://files.example/y.wasm", "sha256": sha}}}})),
        )
        .await?;
    // Another team's existing Plugin: a change of its spec is refused; a label is not code.
    ours.create(&PostParams::default(), &object("someone-elses")?)
        .await?;
    let e = theirs
        .patch(
            "someone-elses",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"https": {"url": "https://files.example/evil.wasm", "sha256": sha}}}})),
        )
        .await
        .expect_err("a change of another team's spec is refused");
    assert!(
        matches!(&e, kube::Error::Api(a) if a.code == 403 && a.message.contains("needs the verb run")),
        "{e:?}"
    );
    let stored = ours.get("someone-elses").await?;
    assert_eq!(
        stored.data["spec"]["source"]["https"]["url"], "https://files.example/x.wasm",
        "the stored spec is unchanged"
    );
    theirs
        .patch(
            "someone-elses",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"seen-by": "team-a"}}})),
        )
        .await?;
    for n in ["team-a-reloader", "someone-elses"] {
        ours.delete(n, &DeleteParams::default()).await?;
    }
    Ok(())
}
