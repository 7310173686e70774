//! Foo → Deployment, as kubernetes/sample-controller: each Foo gets a Deployment of
//! `spec.replicas` nginx Pods named `spec.deploymentName`, and reports the Deployment's
//! available replicas in its status. The host applies the Deployment (server-side apply, the Foo
//! as its controller owner) and deletes the old one when the name changes.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use wcm_sdk::helpers::write_status_if_changed;
use wcm_sdk::{Action, Children, Context, Controller, Description, Error, ObjectKey, ObjectRef};
use wcm_sdk::{Permission, Request, Typed, Watch};

#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "samplecontroller.k8s.io",
    version = "v1alpha1",
    kind = "Foo",
    namespaced
)]
#[kube(
    status = "FooStatus",
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.availableReplicas"
    )
)]
// Groups ending in k8s.io are reserved: the API server takes this CRD only when it says so.
#[kube(annotation("api-approved.kubernetes.io", "unapproved, experimental-only"))]
#[serde(rename_all = "camelCase")]
pub struct FooSpec {
    pub deployment_name: String,
    // As upstream's CRD: whoever may write a Foo gets at most 10 Pods from it.
    #[schemars(range(min = 1, max = 10))]
    pub replicas: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FooStatus {
    pub available_replicas: i32,
}

/// The only fields of the Deployment this plugin reads (see "Keeping components small").
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Available {
    metadata: ObjectMeta,
    status: AvailableStatus,
}
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct AvailableStatus {
    available_replicas: i32,
}

pub struct SampleController;

impl Controller for SampleController {
    type Primary = Foo;

    fn describe() -> Description {
        Description::new("sample-controller", env!("CARGO_PKG_VERSION"))
            // The host records the set of children on the Foo, and the status is ours to write.
            .permission(Permission::of::<Foo>(&["patch"]))
            .permission(Permission::of::<Foo>(&["patch"]).status())
            .owns::<Deployment>()
    }

    // Status writes do not wake it; a change of its Deployment does (`owns`).
    fn watch() -> Watch {
        Watch::of::<Foo>().ignore_status_changes()
    }

    fn reconcile(ctx: &Context, obj: Option<Foo>, req: Request) -> Result<Action, Error> {
        // Deleted: the garbage collector deletes its Deployment.
        let Some(obj) = obj else {
            return Ok(Action::done());
        };
        let name = &obj.spec.deployment_name;
        if name.is_empty() {
            return Err(Error::terminal("spec.deploymentName must be specified"));
        }
        let ns = req.namespace().unwrap_or_default();
        let labels = BTreeMap::from([
            ("app".to_string(), "nginx".to_string()),
            ("controller".to_string(), req.name().to_string()),
        ]);
        let deployment = Deployment {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.to_string()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: obj.spec.replicas,
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..Default::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "nginx".into(),
                            image: Some("nginx:latest".into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            ..Default::default()
        };

        // The status follows its own Deployment (one the Foo does not control is not its to
        // report), read from the cache.
        let current = ctx
            .cache::<Deployment>()
            .get_as::<Available>(&ObjectKey::namespaced(ns, name))?
            .unwrap_or_default();
        let owners = current.metadata.owner_references.unwrap_or_default();
        let ours = owners
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == obj.metadata.uid.as_ref());
        let status = FooStatus {
            available_replicas: if ours {
                current.status.available_replicas
            } else {
                0
            },
        };
        if write_status_if_changed(&ctx.api_namespaced::<Foo>(ns), &obj, &status)? {
            ctx.recorder()
                .event(&ObjectRef::from_obj(&obj), "Synced")
                .action("Sync")
                .note("Foo synced successfully")
                .publish();
        }
        Ok(Action::done().with_children(Children::new().add(&deployment)?))
    }
}

wcm_sdk::export_plugin!(Typed<SampleController>);

#[cfg(test)]
mod tests;
