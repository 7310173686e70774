//! The children a reconcile returns (contract 0.3): applied with server-side apply under the
//! plugin's field manager, owned by the primary, members of the primary's ApplySet (KEP-3659),
//! and pruned when they leave the set.
//!
//! Every step is an API call of the plugin's own, made through the same host functions as its
//! other calls (`host_calls.rs`): the plugin's declared permissions, its RBAC identity, its API
//! budget, its host-call cap and its recording apply to them as to any call it makes itself.
//!
//! The ApplySet:
//! - the primary is the parent: label `applyset.kubernetes.io/id`, annotations
//!   `applyset.kubernetes.io/tooling`, `applyset.kubernetes.io/contains-group-kinds` and (children
//!   outside the primary's namespace) `applyset.kubernetes.io/additional-namespaces`, written by
//!   server-side apply under the field manager `wcm:NAME:applyset`; plus `wcm.dev/applyset-kinds`,
//!   the group/version/kind of each, so a kind no child has any more can still be listed;
//! - each child: label `applyset.kubernetes.io/part-of`, and the primary as its controller owner.
//!
//! As `kubectl apply --prune` does, the parent's kinds grow before the children are applied, and
//! shrink only after every prune succeeded. A prune deletes only an object that is labelled as a
//! member, is controlled by this incarnation of the primary (owner UID) **and** was applied by
//! this plugin's field manager (its managedFields): an object someone else made with the same
//! labels is never deleted.

use std::collections::BTreeSet;

use base64::Engine as _;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::call_ctx::CallCtx;
use crate::cluster::api::CallOptions;
use crate::contract::validate::{self, shown};
use crate::contract::wcm::reconciler::{client, events};
use crate::contract::{
    Action, ApiError, Child, KindKey, KindRef, ObjectKey, Outcome, ReconcileError, Request,
};

/// Children one reconcile may return.
pub const MAX_CHILDREN: usize = 128;
/// Kinds and namespaces one ApplySet may span (what the parent records is bounded too: a user
/// who edits the primary's annotations cannot make the host list without end).
pub const MAX_KINDS: usize = 16;
pub const MAX_NAMESPACES: usize = 16;

pub const LABEL_ID: &str = "applyset.kubernetes.io/id";
pub const LABEL_PART_OF: &str = "applyset.kubernetes.io/part-of";
pub const ANNOTATION_TOOLING: &str = "applyset.kubernetes.io/tooling";
pub const ANNOTATION_GROUP_KINDS: &str = "applyset.kubernetes.io/contains-group-kinds";
pub const ANNOTATION_NAMESPACES: &str = "applyset.kubernetes.io/additional-namespaces";
pub const ANNOTATION_KINDS: &str = "wcm.dev/applyset-kinds";
pub const TOOLING: &str = "wasm-controller-manager/v0.3.0";
/// The field-manager suffix of the parent's ApplySet fields.
const PARENT_MANAGER_SUFFIX: &str = "applyset";

/// The ApplySet ID of a parent, as KEP-3659 defines it:
/// `applyset-<base64url(sha256(<name>.<namespace>.<kind>.<group>))>-v1`.
pub fn applyset_id(name: &str, namespace: &str, kind: &str, group: &str) -> String {
    let digest = Sha256::digest(format!("{name}.{namespace}.{kind}.{group}"));
    format!(
        "applyset-{}-v1",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
    )
}

/// The primary, as read from the cached object (itself from the API server, but a value anyone
/// who may write the primary shaped: checked like a plugin's).
struct Parent {
    kind: KindRef,
    name: String,
    namespace: Option<String>,
    uid: String,
    id: String,
    /// What the parent records now.
    kinds: BTreeSet<KindKey>,
    namespaces: BTreeSet<String>,
    labelled: bool,
}

fn api_version_parts(api_version: &str) -> (String, String) {
    match api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut v = v;
    for p in path {
        v = v.get(p)?;
    }
    v.as_str()
}

impl Parent {
    fn read(object: &str) -> Result<Parent, String> {
        let v: Value =
            serde_json::from_str(object).map_err(|e| format!("the primary is not JSON: {e}"))?;
        let (group, version) = api_version_parts(str_at(&v, &["apiVersion"]).unwrap_or(""));
        let kind = KindRef {
            group,
            version,
            kind: str_at(&v, &["kind"]).unwrap_or("").to_string(),
        };
        validate::kind(&kind).map_err(|e| format!("the primary has an {e}"))?;
        let name = str_at(&v, &["metadata", "name"]).unwrap_or("").to_string();
        validate::name(&name).map_err(|e| format!("the primary has an {e}"))?;
        let namespace = str_at(&v, &["metadata", "namespace"])
            .filter(|ns| !ns.is_empty())
            .map(str::to_string);
        if let Some(ns) = &namespace {
            validate::namespace(ns).map_err(|e| format!("the primary has an {e}"))?;
        }
        let uid = str_at(&v, &["metadata", "uid"]).unwrap_or("").to_string();
        validate::uid(&uid).map_err(|e| format!("the primary has an {e}"))?;
        let id = applyset_id(&name, namespace.as_deref().unwrap_or(""), &kind.kind, &kind.group);
        let annotation = |k: &str| str_at(&v, &["metadata", "annotations", k]).unwrap_or("");
        // Recorded by an earlier reconcile (or written by someone who may edit the primary):
        // only well-formed entries count, and only so many.
        let kinds = annotation(ANNOTATION_KINDS)
            .split(',')
            .filter_map(parse_gvk)
            .take(MAX_KINDS)
            .collect();
        let namespaces = annotation(ANNOTATION_NAMESPACES)
            .split(',')
            .filter(|ns| validate::namespace(ns).is_ok())
            .take(MAX_NAMESPACES)
            .map(str::to_string)
            .collect();
        let labelled = str_at(&v, &["metadata", "labels", LABEL_ID]) == Some(id.as_str());
        Ok(Parent {
            kind,
            name,
            namespace,
            uid,
            id,
            kinds,
            namespaces,
            labelled,
        })
    }

    fn key(&self) -> ObjectKey {
        ObjectKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    fn owner_ref(&self) -> Value {
        json!({
            "apiVersion": KindKey::from(&self.kind).api_version(),
            "kind": self.kind.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        })
    }

    /// The parent's ApplySet fields for these kinds and namespaces.
    fn apply_body(&self, kinds: &BTreeSet<KindKey>, namespaces: &BTreeSet<String>) -> Value {
        let group_kinds: BTreeSet<String> = kinds
            .iter()
            .map(|k| {
                if k.group.is_empty() {
                    k.kind.clone()
                } else {
                    format!("{}.{}", k.kind, k.group)
                }
            })
            .collect();
        let gvks: Vec<String> = kinds.iter().map(gvk_text).collect();
        let mut annotations = json!({
            ANNOTATION_TOOLING: TOOLING,
            ANNOTATION_GROUP_KINDS: group_kinds.into_iter().collect::<Vec<_>>().join(","),
            ANNOTATION_KINDS: gvks.join(","),
        });
        let additional: Vec<&str> = namespaces
            .iter()
            .filter(|ns| Some(ns.as_str()) != self.namespace.as_deref())
            .map(String::as_str)
            .collect();
        if !additional.is_empty() {
            annotations[ANNOTATION_NAMESPACES] = json!(additional.join(","));
        }
        let mut metadata = json!({
            "name": self.name,
            "labels": {LABEL_ID: self.id},
            "annotations": annotations,
        });
        if let Some(ns) = &self.namespace {
            metadata["namespace"] = json!(ns);
        }
        json!({
            "apiVersion": KindKey::from(&self.kind).api_version(),
            "kind": self.kind.kind,
            "metadata": metadata,
        })
    }
}

/// `group/version/Kind` (the core group empty: `/v1/ConfigMap`).
fn gvk_text(k: &KindKey) -> String {
    format!("{}/{}/{}", k.group, k.version, k.kind)
}

fn parse_gvk(s: &str) -> Option<KindKey> {
    let mut parts = s.trim().splitn(3, '/');
    let kind = KindRef {
        group: parts.next()?.to_string(),
        version: parts.next()?.to_string(),
        kind: parts.next()?.to_string(),
    };
    validate::kind(&kind).ok()?;
    Some(KindKey::from(&kind))
}

fn kind_ref(k: &KindKey) -> KindRef {
    KindRef {
        group: k.group.clone(),
        version: k.version.clone(),
        kind: k.kind.clone(),
    }
}

/// A child made ready to apply: its key and the body the host sends.
struct Ready {
    kind: KindKey,
    key: ObjectKey,
    body: String,
    force: bool,
}

/// What went wrong with one child.
struct Failed {
    child: String,
    error: ApiError,
}

impl Failed {
    fn permanent(&self) -> bool {
        matches!(self.error.code, 400 | 403 | 404 | 405 | 422)
    }
}

fn refused(child: String, message: impl Into<String>) -> Failed {
    Failed {
        child,
        error: ApiError {
            code: 400,
            reason: "InvalidChild".into(),
            message: message.into(),
        },
    }
}

/// Checks a child and makes the body the host applies: the primary as controller owner and the
/// ApplySet label set by the host, whatever the plugin wrote there.
fn prepare(parent: &Parent, index: usize, child: Child) -> Result<Ready, Failed> {
    let at = format!("child {index}");
    validate::kind(&child.kind).map_err(|e| refused(at.clone(), e.to_string()))?;
    let mut v: Value = serde_json::from_str(&child.object)
        .map_err(|e| refused(at.clone(), format!("not JSON: {e}")))?;
    let api_version = KindKey::from(&child.kind).api_version();
    let Some(object) = v.as_object_mut() else {
        return Err(refused(at, "not a JSON object"));
    };
    if object.get("apiVersion").and_then(Value::as_str) != Some(api_version.as_str())
        || object.get("kind").and_then(Value::as_str) != Some(child.kind.kind.as_str())
    {
        return Err(refused(
            at,
            format!(
                "apiVersion and kind must be {} and {} (the child's kind)",
                shown(&api_version),
                shown(&child.kind.kind)
            ),
        ));
    }
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else {
        return Err(refused(at, "metadata is not an object"));
    };
    let name = metadata
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    validate::name(&name).map_err(|e| refused(at.clone(), e.to_string()))?;
    let named = format!("{} {}", child.kind.kind, shown(&name));
    let namespace = match (
        metadata
            .get("namespace")
            .and_then(Value::as_str)
            .filter(|ns| !ns.is_empty()),
        &parent.namespace,
    ) {
        // A namespaced primary owns children in its own namespace only (an owner reference does
        // not cross namespaces).
        (Some(ns), Some(p)) if ns != p => {
            return Err(refused(
                named,
                format!(
                    "namespace {} is not the primary's ({p}): an owner reference does not cross namespaces",
                    shown(ns)
                ),
            ));
        }
        (_, Some(p)) => Some(p.clone()),
        (Some(ns), None) => {
            validate::namespace(ns).map_err(|e| refused(named.clone(), e.to_string()))?;
            Some(ns.to_string())
        }
        (None, None) => None,
    };
    if let Some(ns) = &namespace {
        metadata.insert("namespace".into(), json!(ns));
    }
    for forbidden in ["uid", "resourceVersion", "managedFields", "deletionTimestamp"] {
        metadata.remove(forbidden);
    }
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(labels) = labels.as_object_mut() else {
        return Err(refused(named, "metadata.labels is not an object"));
    };
    labels.insert(LABEL_PART_OF.into(), json!(parent.id));
    let mut owners = match metadata.remove("ownerReferences") {
        Some(Value::Array(refs)) => refs,
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(refused(named, "metadata.ownerReferences is not a list")),
    };
    if owners.iter().any(|o| {
        o.get("controller").and_then(Value::as_bool) == Some(true)
            && o.get("uid").and_then(Value::as_str) != Some(parent.uid.as_str())
    }) {
        return Err(refused(
            named,
            "names another controller: the primary is the controller of its children",
        ));
    }
    owners.retain(|o| o.get("uid").and_then(Value::as_str) != Some(parent.uid.as_str()));
    owners.push(parent.owner_ref());
    metadata.insert("ownerReferences".into(), Value::Array(owners));
    Ok(Ready {
        kind: KindKey::from(&child.kind),
        key: ObjectKey { namespace, name },
        body: v.to_string(),
        force: child.force,
    })
}

/// Whether a listed object is one this plugin applied for this primary: labelled as a member,
/// controlled by the primary's UID, and with fields applied by the plugin's field manager.
fn applied_by_us(item: &Value, parent: &Parent, manager: &str) -> bool {
    let metadata = &item["metadata"];
    let member = str_at(metadata, &["labels", LABEL_PART_OF]) == Some(parent.id.as_str());
    let controlled = metadata["ownerReferences"].as_array().is_some_and(|refs| {
        refs.iter().any(|o| {
            o["controller"].as_bool() == Some(true)
                && o["uid"].as_str() == Some(parent.uid.as_str())
        })
    });
    let applied = metadata["managedFields"].as_array().is_some_and(|fields| {
        fields.iter().any(|f| {
            f["manager"].as_str() == Some(manager) && f["operation"].as_str() == Some("Apply")
        })
    });
    member && controlled && applied
}

impl CallCtx {
    /// Applies the children of `outcome` for `req`'s primary and prunes the ones gone from the
    /// set; the reconcile's result: its action, or an error naming each child that failed
    /// (retried with the key's backoff, unless every failure is one a retry cannot mend).
    pub(crate) async fn settle_children(
        &mut self,
        req: &Request,
        outcome: Outcome,
    ) -> wasmtime::Result<Result<Action, ReconcileError>> {
        let Some(children) = outcome.children else {
            return Ok(Ok(outcome.action));
        };
        let Some(object) = &req.object else {
            // The primary is gone: the garbage collector removes what it owned.
            return Ok(Ok(outcome.action));
        };
        let fail = |message: String, terminal: bool| {
            Ok(Err(ReconcileError {
                message,
                terminal,
                retry_after_ms: None,
            }))
        };
        if children.len() > MAX_CHILDREN {
            return fail(
                format!(
                    "{} children returned; at most {MAX_CHILDREN}",
                    children.len()
                ),
                true,
            );
        }
        let parent = match Parent::read(object) {
            Ok(p) => p,
            Err(why) => return fail(why, true),
        };
        let mut failed: Vec<Failed> = Vec::new();
        let mut ready: Vec<Ready> = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, child) in children.into_iter().enumerate() {
            match prepare(&parent, i, child) {
                Ok(r) => {
                    if seen.insert((r.kind.clone(), r.key.namespace.clone(), r.key.name.clone())) {
                        ready.push(r);
                    } else {
                        failed.push(refused(
                            format!("{} {}", r.kind.kind, shown(&r.key.name)),
                            "returned twice",
                        ));
                    }
                }
                Err(f) => failed.push(f),
            }
        }
        let wanted_kinds: BTreeSet<KindKey> = ready.iter().map(|r| r.kind.clone()).collect();
        let wanted_namespaces: BTreeSet<String> = ready
            .iter()
            .filter_map(|r| r.key.namespace.clone())
            .collect();
        if wanted_kinds.len() > MAX_KINDS || wanted_namespaces.len() > MAX_NAMESPACES {
            return fail(
                format!("children span more than {MAX_KINDS} kinds or {MAX_NAMESPACES} namespaces"),
                true,
            );
        }
        // Grow the parent's record first: a child is never applied without its parent knowing
        // its kind, so a crash between the two cannot leave a child no prune would find.
        let grown_kinds: BTreeSet<KindKey> = parent.kinds.union(&wanted_kinds).cloned().collect();
        let grown_namespaces: BTreeSet<String> = parent
            .namespaces
            .union(&wanted_namespaces)
            .cloned()
            .collect();
        if !parent.labelled
            || grown_kinds != parent.kinds
            || grown_namespaces.len() != parent.namespaces.len()
        {
            if grown_kinds.len() > MAX_KINDS || grown_namespaces.len() > MAX_NAMESPACES {
                return fail(
                    format!(
                        "the primary's ApplySet would span more than {MAX_KINDS} kinds or {MAX_NAMESPACES} namespaces"
                    ),
                    true,
                );
            }
            if let Err(e) = self
                .apply_parent(&parent, &grown_kinds, &grown_namespaces)
                .await?
            {
                let permanent = matches!(e.code, 400 | 403 | 404 | 422);
                return fail(
                    format!(
                        "recording the ApplySet on the primary (server-side apply of its labels and annotations, which needs patch on the primary's resource) failed: {} {}: {}",
                        e.code, e.reason, e.message
                    ),
                    permanent,
                );
            }
        }
        // Apply each child.
        let mut applied = BTreeSet::new();
        for r in &ready {
            let options = client::PatchOptions {
                field_manager_suffix: None,
                force: r.force,
                dry_run: false,
            };
            let out = client::Host::patch(
                self,
                kind_ref(&r.kind),
                r.key.clone(),
                client::PatchType::Apply,
                r.body.clone(),
                options,
            )
            .await?;
            match out {
                Ok(_) => {
                    applied.insert((r.kind.clone(), r.key.namespace.clone(), r.key.name.clone()));
                }
                Err(error) => failed.push(Failed {
                    child: format!("{} {}", r.kind.kind, shown(&r.key.name)),
                    error,
                }),
            }
        }
        // Prune: what the parent recorded (grown above) and is no longer wanted.
        let manager = CallOptions::default().field_manager(self.services.plugin_name());
        let mut prune_failed = false;
        let mut still_there: BTreeSet<KindKey> = BTreeSet::new();
        for kind in &grown_kinds {
            // Where members of this kind can be: the primary's namespace; for a cluster-scoped
            // primary, the cluster scope or the namespaces recorded (the kind's scope from
            // discovery, both when unknown).
            let scopes: Vec<Option<String>> = match &parent.namespace {
                Some(ns) => vec![Some(ns.clone())],
                None => {
                    let namespaced = self.services.namespaced(&kind_ref(kind)).await;
                    let mut scopes = Vec::new();
                    if namespaced != Some(false) {
                        scopes.extend(grown_namespaces.iter().cloned().map(Some));
                    }
                    if namespaced != Some(true) {
                        scopes.push(None);
                    }
                    scopes
                }
            };
            for ns in &scopes {
                let options = client::ListOptions {
                    label_selector: Some(format!("{LABEL_PART_OF}={}", parent.id)),
                    field_selector: None,
                    limit: Some(500),
                    continue_token: None,
                };
                let listed = client::Host::list(self, kind_ref(kind), ns.clone(), options).await?;
                let items = match listed {
                    Ok(body) => serde_json::from_str::<Value>(&body)
                        .ok()
                        .and_then(|v| v.get("items").and_then(Value::as_array).cloned())
                        .unwrap_or_default(),
                    // A cluster-scoped kind listed in a namespace, or a namespaced one at the
                    // cluster scope: nothing of it there.
                    Err(e) if e.code == 404 => continue,
                    Err(error) => {
                        prune_failed = true;
                        still_there.insert(kind.clone());
                        failed.push(Failed {
                            child: format!("pruning {}", kind.kind),
                            error,
                        });
                        continue;
                    }
                };
                for item in items {
                    if !applied_by_us(&item, &parent, &manager) {
                        continue;
                    }
                    let name = str_at(&item, &["metadata", "name"]).unwrap_or("").to_string();
                    let item_ns = str_at(&item, &["metadata", "namespace"]).map(str::to_string);
                    let uid = str_at(&item, &["metadata", "uid"]).map(str::to_string);
                    let wanted =
                        seen.contains(&(kind.clone(), item_ns.clone(), name.clone()));
                    if wanted {
                        still_there.insert(kind.clone());
                        continue;
                    }
                    if validate::name(&name).is_err() {
                        continue;
                    }
                    let key = ObjectKey {
                        namespace: item_ns,
                        name: name.clone(),
                    };
                    let options = client::DeleteOptions {
                        propagation: Some(client::Propagation::Background),
                        precondition_uid: uid,
                        precondition_resource_version: None,
                        dry_run: false,
                    };
                    match client::Host::delete(self, kind_ref(kind), key, options).await? {
                        Ok(()) => {
                            self.child_event(
                                &parent,
                                false,
                                "ChildPruned",
                                "Delete",
                                format!("{} {} is no longer returned: deleted", kind.kind, name),
                            )
                            .await?;
                        }
                        Err(e) if e.code == 404 || e.code == 409 => {}
                        Err(error) => {
                            prune_failed = true;
                            still_there.insert(kind.clone());
                            failed.push(Failed {
                                child: format!("pruning {} {}", kind.kind, shown(&name)),
                                error,
                            });
                        }
                    }
                }
            }
        }
        // Shrink the parent's record to what is left, once nothing failed.
        let left_kinds: BTreeSet<KindKey> = wanted_kinds.union(&still_there).cloned().collect();
        if failed.is_empty() && !prune_failed && left_kinds != grown_kinds {
            let _ = self
                .apply_parent(&parent, &left_kinds, &wanted_namespaces)
                .await?;
        }
        if failed.is_empty() {
            return Ok(Ok(outcome.action));
        }
        for f in &failed {
            self.child_event(
                &parent,
                true,
                "ChildFailed",
                "Apply",
                format!(
                    "{}: {} {}: {}",
                    f.child,
                    f.error.code,
                    f.error.reason,
                    validate::truncate(&f.error.message, 600)
                ),
            )
            .await?;
        }
        let terminal = failed.iter().all(Failed::permanent);
        let summary: Vec<String> = failed
            .iter()
            .take(8)
            .map(|f| format!("{}: {} {}", f.child, f.error.code, f.error.reason))
            .collect();
        fail(
            format!(
                "{} of the children failed ({}{})",
                failed.len(),
                summary.join("; "),
                if failed.len() > 8 { "; ..." } else { "" }
            ),
            terminal,
        )
    }

    async fn apply_parent(
        &mut self,
        parent: &Parent,
        kinds: &BTreeSet<KindKey>,
        namespaces: &BTreeSet<String>,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let options = client::PatchOptions {
            field_manager_suffix: Some(PARENT_MANAGER_SUFFIX.into()),
            force: true,
            dry_run: false,
        };
        client::Host::patch(
            self,
            parent.kind.clone(),
            parent.key(),
            client::PatchType::Apply,
            parent.apply_body(kinds, namespaces).to_string(),
            options,
        )
        .await
    }

    async fn child_event(
        &mut self,
        parent: &Parent,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) -> wasmtime::Result<()> {
        let regarding = events::ObjectRef {
            kind: parent.kind.clone(),
            key: parent.key(),
            uid: Some(parent.uid.clone()),
        };
        let event_type = if warning {
            events::EventType::Warning
        } else {
            events::EventType::Normal
        };
        events::Host::record(
            self,
            regarding,
            event_type,
            reason.into(),
            action.into(),
            note,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applyset_id_is_the_one_kubectl_computes() {
        // KEP-3659: base64url (no padding) of sha256("<name>.<namespace>.<kind>.<group>").
        let id = applyset_id("web", "default", "Foo", "example.com");
        let digest = Sha256::digest("web.default.Foo.example.com");
        let expect = format!(
            "applyset-{}-v1",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
        );
        assert_eq!(id, expect);
        assert!(id.len() <= 63, "a label value: {id}");
        assert!(!id.contains(['+', '/', '=']));
    }

    fn parent() -> Parent {
        Parent::read(
            r#"{"apiVersion":"example.com/v1","kind":"Foo","metadata":{"name":"web","namespace":"team","uid":"0b9d3c1e-1111-2222-3333-444455556666"}}"#,
        )
        .expect("a primary")
    }

    #[test]
    fn a_child_gets_the_owner_and_label_and_cannot_leave_the_namespace() {
        let p = parent();
        let child = Child {
            kind: KindRef {
                group: "apps".into(),
                version: "v1".into(),
                kind: "Deployment".into(),
            },
            object: r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","labels":{"applyset.kubernetes.io/part-of":"forged"}}}"#.into(),
            force: true,
        };
        let ready = prepare(&p, 0, child.clone()).ok().expect("valid");
        let body: Value = serde_json::from_str(&ready.body).expect("json");
        assert_eq!(body["metadata"]["namespace"], "team");
        assert_eq!(body["metadata"]["labels"][LABEL_PART_OF], json!(p.id));
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], json!(p.uid));
        assert_eq!(body["metadata"]["ownerReferences"][0]["blockOwnerDeletion"], true);

        for bad in [
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"other"}}"#,
            r#"{"apiVersion":"v1","kind":"Deployment","metadata":{"name":"web"}}"#,
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"../x"}}"#,
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","ownerReferences":[{"controller":true,"uid":"someone-else"}]}}"#,
            r#"[1,2]"#,
        ] {
            let c = Child {
                object: bad.into(),
                ..child.clone()
            };
            assert!(prepare(&p, 0, c).is_err(), "{bad} passed");
        }
    }

    #[test]
    fn only_objects_applied_by_the_plugin_for_this_primary_are_pruned() {
        let p = parent();
        let ours = json!({"metadata": {
            "labels": {LABEL_PART_OF: p.id},
            "ownerReferences": [{"controller": true, "uid": p.uid}],
            "managedFields": [{"manager": "wcm:foo", "operation": "Apply"}],
        }});
        assert!(applied_by_us(&ours, &p, "wcm:foo"));
        let mut by_hand = ours.clone();
        by_hand["metadata"]["managedFields"] = json!([{"manager": "kubectl", "operation": "Apply"}]);
        assert!(!applied_by_us(&by_hand, &p, "wcm:foo"));
        let mut other_owner = ours.clone();
        other_owner["metadata"]["ownerReferences"] = json!([{"controller": true, "uid": "x"}]);
        assert!(!applied_by_us(&other_owner, &p, "wcm:foo"));
        assert!(!applied_by_us(&ours, &p, "wcm:bar"));
    }

    #[test]
    fn what_the_parent_records_is_read_bounded_and_checked() {
        let many: Vec<String> = (0..100).map(|i| format!("g{i}.io/v1/K")).collect();
        let object = json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n","uid":"0b9d3c1e-1111-2222-3333-444455556666","annotations":{
            ANNOTATION_KINDS: format!("{},bad kind,/v1/ConfigMap", many.join(",")),
        }}});
        let p = Parent::read(&object.to_string()).expect("read");
        assert_eq!(p.kinds.len(), MAX_KINDS);
        assert!(p.namespace.is_none());
    }
}
