//! Installs the CRDs from `manifests/crds/` and waits until the API server serves them.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

/// Server-side applies every `*.yaml` (or `*.json`) CRD in `dir` and waits for each to be Established.
pub async fn install_all(client: &kube::Client, dir: &Path) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        })
        .collect();
    files.sort();
    for file in files {
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text)
            .with_context(|| format!("parse {} as a CRD", file.display()))?;
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        api.patch(
            &name,
            &PatchParams::apply("wcm-testenv").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("apply CRD {name} from {}", file.display()))?;
        wait_established(&api, &name).await?;
    }
    Ok(())
}

async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) -> Result<()> {
    for _ in 0..300 {
        let crd = api.get(name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("CRD {name} not Established after 30 s")
}
