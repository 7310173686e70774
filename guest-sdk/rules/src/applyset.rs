//! The children a reconcile returns (contract 0.3) and their ApplySet (KEP-3659): what the host
//! sends for each child, what it records on the primary, and which listed objects a prune may
//! delete. The host (async, through the plugin's own calls) and MockHost (sync) follow the same
//! steps with these decisions:
//!
//! 1. [`Parent::read`] the primary; [`prepare`] each child (refused ones are per-child errors).
//! 2. A primary another tool's ApplySet or another plugin's children hang on is refused
//!    ([`Parent::claimed_by_other`]). When the primary does not yet record every kind and
//!    namespace of the children, merge-patch [`Parent::record_patch`] of the union onto it (field
//!    manager `wcm:NAME:applyset`; with its UID, so it never creates a primary nor writes another
//!    incarnation).
//! 3. Apply each child with server-side apply (field manager `wcm:NAME`), unless an object of its
//!    name exists that this primary does not control (never taken over).
//! 4. For each recorded kind the plugin declares (one version per group and kind: membership does
//!    not depend on the version an object is read at), in each of [`Parent::scopes`], list with
//!    [`Parent::selector`] in pages (at most [`MAX_LISTED`]); delete (UID precondition) each item
//!    that [`applied_by`] says is ours, that is not wanted and that was not applied just now.
//! 5. When nothing failed, merge-patch [`Parent::record_patch`] of what is left.
//!
//! A prune deletes only an object labelled as a member, controlled by this incarnation of the
//! primary (owner UID) **and** with fields applied by the plugin's field manager: an object
//! someone else made with the same label is not deleted. (Someone who may write an object could
//! forge all three, `managedFields` included; the owner reference alone already hands such an
//! object to the garbage collector with the primary.)

use std::collections::BTreeSet;

use base64::Engine as _;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::names::{self, shown};

/// Children one reconcile may return.
pub const MAX_CHILDREN: usize = 128;
/// Kinds and namespaces one ApplySet may span. What a primary records is read only up to these
/// too: someone who may edit the primary cannot make the host list without end.
pub const MAX_KINDS: usize = 16;
pub const MAX_NAMESPACES: usize = 16;

pub const LABEL_ID: &str = "applyset.kubernetes.io/id";
pub const LABEL_PART_OF: &str = "applyset.kubernetes.io/part-of";
pub const ANNOTATION_TOOLING: &str = "applyset.kubernetes.io/tooling";
pub const ANNOTATION_GROUP_KINDS: &str = "applyset.kubernetes.io/contains-group-kinds";
pub const ANNOTATION_NAMESPACES: &str = "applyset.kubernetes.io/additional-namespaces";
/// The group/version/kind of each member kind, so a kind no child has any more can still be
/// listed (the KEP's annotation has group and kind only).
pub const ANNOTATION_KINDS: &str = "wcm.dev/applyset-kinds";
pub const TOOLING: &str = "wasm-controller-manager/v0.3.0";
/// The plugin whose children the set holds: one plugin's per primary.
pub const ANNOTATION_OWNER: &str = "wcm.dev/applyset-plugin";
/// The field-manager suffix under which the host writes the primary's ApplySet fields.
pub const PARENT_MANAGER_SUFFIX: &str = "applyset";

/// A kind at a version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gvk {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl Gvk {
    pub fn new(group: &str, version: &str, kind: &str) -> Self {
        Gvk {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn is_valid(&self) -> bool {
        names::kind(&self.group, &self.version, &self.kind)
    }

    /// Group and kind: what membership is keyed by. One object is the same member whatever
    /// version it is read at (a CRD serving v1alpha1 and v1, HPAs at autoscaling/v1 and v2).
    pub fn group_kind(&self) -> (String, String) {
        (self.group.clone(), self.kind.clone())
    }

    fn from_api_version(api_version: &str, kind: &str) -> Self {
        match api_version.split_once('/') {
            Some((g, v)) => Gvk::new(g, v, kind),
            None => Gvk::new("", api_version, kind),
        }
    }

    /// `group/version/Kind` (the core group empty: `/v1/ConfigMap`).
    fn text(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.kind)
    }

    fn parse(s: &str) -> Option<Gvk> {
        let mut parts = s.trim().splitn(3, '/');
        let gvk = Gvk::new(parts.next()?, parts.next()?, parts.next()?);
        gvk.is_valid().then_some(gvk)
    }
}

/// The ApplySet ID of a parent, as KEP-3659 defines it (and kubectl computes it):
/// `applyset-<base64url(sha256(<name>.<namespace>.<kind>.<group>))>-v1`.
pub fn applyset_id(name: &str, namespace: &str, kind: &str, group: &str) -> String {
    let digest = Sha256::digest(format!("{name}.{namespace}.{kind}.{group}"));
    format!(
        "applyset-{}-v1",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
    )
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut v = v;
    for p in path {
        v = v.get(p)?;
    }
    v.as_str()
}

/// The primary, as read from the cached object: from the API server, but shaped by anyone who
/// may write it, so checked like a plugin's values.
#[derive(Debug, Clone)]
pub struct Parent {
    pub kind: Gvk,
    pub name: String,
    pub namespace: Option<String>,
    pub uid: String,
    pub id: String,
    /// The member kinds and namespaces the primary records now.
    pub kinds: BTreeSet<Gvk>,
    pub namespaces: BTreeSet<String>,
    /// Whether it carries its ApplySet ID label already.
    pub labelled: bool,
    /// The ApplySet tooling and the plugin the primary names, if any.
    pub tooling: Option<String>,
    pub owner: Option<String>,
}

impl Parent {
    pub fn read(object: &str) -> Result<Parent, String> {
        let v: Value =
            serde_json::from_str(object).map_err(|e| format!("the primary is not JSON: {e}"))?;
        let kind = Gvk::from_api_version(
            str_at(&v, &["apiVersion"]).unwrap_or(""),
            str_at(&v, &["kind"]).unwrap_or(""),
        );
        if !kind.is_valid() {
            return Err("the primary has no valid apiVersion and kind".into());
        }
        let name = str_at(&v, &["metadata", "name"]).unwrap_or("").to_string();
        if !names::object_name(&name) {
            return Err(format!("the primary's name {} is not valid", shown(&name)));
        }
        let namespace = str_at(&v, &["metadata", "namespace"])
            .filter(|ns| !ns.is_empty())
            .map(str::to_string);
        if namespace.as_deref().is_some_and(|ns| !names::dns_label(ns)) {
            return Err("the primary's namespace is not valid".into());
        }
        let uid = str_at(&v, &["metadata", "uid"]).unwrap_or("").to_string();
        if !names::uid(&uid) {
            return Err("the primary has no valid uid".into());
        }
        let id = applyset_id(
            &name,
            namespace.as_deref().unwrap_or(""),
            &kind.kind,
            &kind.group,
        );
        let annotation = |k: &str| str_at(&v, &["metadata", "annotations", k]).unwrap_or("");
        // One version per group and kind (the first recorded).
        let mut seen = BTreeSet::new();
        let kinds = annotation(ANNOTATION_KINDS)
            .split(',')
            .filter_map(Gvk::parse)
            .filter(|k| seen.insert(k.group_kind()))
            .take(MAX_KINDS)
            .collect();
        // A namespaced primary's children are in its namespace only: nothing else is read.
        let namespaces = if namespace.is_some() {
            BTreeSet::new()
        } else {
            annotation(ANNOTATION_NAMESPACES)
                .split(',')
                .filter(|ns| names::dns_label(ns))
                .take(MAX_NAMESPACES)
                .map(str::to_string)
                .collect()
        };
        let text = |k: &str| {
            let v = annotation(k);
            (!v.is_empty()).then(|| v.chars().take(253).collect::<String>())
        };
        let (tooling, owner) = (text(ANNOTATION_TOOLING), text(ANNOTATION_OWNER));
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
            tooling,
            owner,
        })
    }

    /// Why `plugin` may not keep children on this primary: another tool's ApplySet (kubectl's,
    /// say) or another plugin's children already hang on it. One set per primary, one owner.
    pub fn claimed_by_other(&self, plugin: &str) -> Option<String> {
        if let Some(t) = &self.tooling
            && t != TOOLING
        {
            return Some(format!(
                "the primary is the parent of an ApplySet of another tool ({})",
                shown(t)
            ));
        }
        match &self.owner {
            Some(o) if o != plugin => Some(format!(
                "the primary's children belong to plugin {}: one plugin's children per primary",
                shown(o)
            )),
            _ => None,
        }
    }

    /// The kinds recorded and wanted, one version per group and kind: the wanted one where a
    /// child has the kind, else the recorded one.
    pub fn kinds_with(&self, wanted: &BTreeSet<Gvk>) -> BTreeSet<Gvk> {
        let wanted_gk: BTreeSet<(String, String)> = wanted.iter().map(Gvk::group_kind).collect();
        wanted
            .iter()
            .cloned()
            .chain(
                self.kinds
                    .iter()
                    .filter(|k| !wanted_gk.contains(&k.group_kind()))
                    .cloned(),
            )
            .collect()
    }

    /// The controller owner reference each child gets.
    pub fn owner_ref(&self) -> Value {
        json!({
            "apiVersion": self.kind.api_version(),
            "kind": self.kind.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        })
    }

    /// The label selector of the members.
    pub fn selector(&self) -> String {
        format!("{LABEL_PART_OF}={}", self.id)
    }

    /// Whether the primary must be written before children of these kinds and namespaces are
    /// applied (it does not record all of them yet).
    pub fn must_grow(&self, kinds: &BTreeSet<Gvk>, namespaces: &BTreeSet<String>) -> bool {
        !self.labelled
            || self.owner.is_none()
            || !kinds.is_subset(&self.kinds)
            || (self.namespace.is_none() && !namespaces.is_subset(&self.namespaces))
    }

    /// The primary's ApplySet fields for these kinds and namespaces, written by `plugin`, as a
    /// JSON merge patch: never creates the primary (a deleted one stays deleted), and carries its
    /// UID, which the API server checks (a new incarnation is not written).
    pub fn record_patch(
        &self,
        plugin: &str,
        kinds: &BTreeSet<Gvk>,
        namespaces: &BTreeSet<String>,
    ) -> Value {
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
        let gvks: Vec<String> = kinds.iter().map(Gvk::text).collect();
        let mut annotations = json!({
            ANNOTATION_TOOLING: TOOLING,
            ANNOTATION_OWNER: plugin,
            ANNOTATION_GROUP_KINDS: group_kinds.into_iter().collect::<Vec<_>>().join(","),
            ANNOTATION_KINDS: gvks.join(","),
            ANNOTATION_NAMESPACES: Value::Null,
        });
        let additional: Vec<&str> = namespaces
            .iter()
            .filter(|ns| Some(ns.as_str()) != self.namespace.as_deref())
            .map(String::as_str)
            .collect();
        if self.namespace.is_none() && !additional.is_empty() {
            annotations[ANNOTATION_NAMESPACES] = json!(additional.join(","));
        }
        json!({"metadata": {
            "uid": self.uid,
            "labels": {LABEL_ID: self.id},
            "annotations": annotations,
        }})
    }

    /// Where members of `kind` can be: the primary's namespace; for a cluster-scoped primary, the
    /// namespaces recorded (a namespaced kind) or the cluster scope (a cluster-scoped one), both
    /// when the kind's scope is not known.
    pub fn scopes(
        &self,
        namespaced: Option<bool>,
        namespaces: &BTreeSet<String>,
    ) -> Vec<Option<String>> {
        match &self.namespace {
            Some(ns) => vec![Some(ns.clone())],
            None => {
                let mut scopes = Vec::new();
                if namespaced != Some(false) {
                    scopes.extend(namespaces.iter().cloned().map(Some));
                }
                if namespaced != Some(true) {
                    scopes.push(None);
                }
                scopes
            }
        }
    }
}

/// A child made ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub kind: Gvk,
    pub namespace: Option<String>,
    pub name: String,
    /// What the host sends: the plugin's object with the primary as controller owner and the
    /// ApplySet label, whatever the plugin wrote there.
    pub body: Value,
}

impl Prepared {
    /// "Deployment \"web\"": how errors and events name the child.
    pub fn named(&self) -> String {
        format!("{} {}", self.kind.kind, shown(&self.name))
    }
}

/// Checks a child of kind `kind` and makes the body the host applies. The error names the child
/// as well as it can.
pub fn prepare(parent: &Parent, kind: &Gvk, object: &str) -> Result<Prepared, (String, String)> {
    let at = |why: String| (format!("a {} child", kind.kind), why);
    if !kind.is_valid() {
        return Err(at(format!("kind {} is not valid", shown(&kind.kind))));
    }
    let mut v: Value = serde_json::from_str(object).map_err(|e| at(format!("not JSON: {e}")))?;
    let api_version = kind.api_version();
    let Some(map) = v.as_object_mut() else {
        return Err(at("not a JSON object".into()));
    };
    if map.get("apiVersion").and_then(Value::as_str) != Some(api_version.as_str())
        || map.get("kind").and_then(Value::as_str) != Some(kind.kind.as_str())
    {
        return Err(at(format!(
            "apiVersion and kind must be {} and {}, the child's kind",
            shown(&api_version),
            shown(&kind.kind)
        )));
    }
    let metadata = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else {
        return Err(at("metadata is not an object".into()));
    };
    let name = metadata
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !names::object_name(&name) {
        return Err(at(format!("metadata.name {} is not valid", shown(&name))));
    }
    let named = format!("{} {}", kind.kind, shown(&name));
    let refuse = |why: String| (named.clone(), why);
    let given = metadata
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|ns| !ns.is_empty());
    let namespace = match (given, &parent.namespace) {
        // A namespaced primary owns children in its own namespace only: an owner reference
        // does not cross namespaces.
        (Some(ns), Some(p)) if ns != p => {
            return Err(refuse(format!(
                "namespace {} is not the primary's ({p}): an owner reference does not cross namespaces",
                shown(ns)
            )));
        }
        (_, Some(p)) => Some(p.clone()),
        (Some(ns), None) if names::dns_label(ns) => Some(ns.to_string()),
        (Some(ns), None) => {
            return Err(refuse(format!("namespace {} is not valid", shown(ns))));
        }
        (None, None) => None,
    };
    if let Some(ns) = &namespace {
        metadata.insert("namespace".into(), json!(ns));
    }
    for dropped in [
        "uid",
        "resourceVersion",
        "managedFields",
        "deletionTimestamp",
        "creationTimestamp",
        "generation",
    ] {
        metadata.remove(dropped);
    }
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(labels) = labels.as_object_mut() else {
        return Err(refuse("metadata.labels is not an object".into()));
    };
    labels.insert(LABEL_PART_OF.into(), json!(parent.id));
    let mut owners = match metadata.remove("ownerReferences") {
        Some(Value::Array(refs)) => refs,
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(refuse("metadata.ownerReferences is not a list".into())),
    };
    if owners.iter().any(|o| {
        o.get("controller").and_then(Value::as_bool) == Some(true)
            && o.get("uid").and_then(Value::as_str) != Some(parent.uid.as_str())
    }) {
        return Err(refuse(
            "names another controller: the primary is the controller of its children".into(),
        ));
    }
    owners.retain(|o| o.get("uid").and_then(Value::as_str) != Some(parent.uid.as_str()));
    owners.push(parent.owner_ref());
    metadata.insert("ownerReferences".into(), Value::Array(owners));
    Ok(Prepared {
        kind: kind.clone(),
        namespace,
        name,
        body: v,
    })
}

/// The `metadata.uid` of an object the API server answered with.
pub fn uid_of(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    v.get("metadata")?.get("uid")?.as_str().map(str::to_string)
}

/// What is known of the object under a child's name before the child is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// None is known: the child is created (POST, which fails with 409 when one exists after
    /// all), then applied.
    Absent,
    /// Controlled by this incarnation of the primary: applied, with its UID as a precondition
    /// (an object deleted and made again by someone else in between is not written).
    Ours(Option<String>),
    /// Someone else's (another controller's, or nobody's): not taken over.
    Other,
    /// The plugin does not watch the child's kind, so its cache cannot tell: the child is
    /// refused (declare the kind with `owns()`).
    Unwatched,
}

impl Existing {
    /// As recorded in a tape (`children.may-apply`).
    pub fn to_json(&self) -> Value {
        match self {
            Existing::Absent => serde_json::json!({"absent": true}),
            Existing::Ours(uid) => serde_json::json!({"ours": uid}),
            Existing::Other => serde_json::json!({"other": true}),
            Existing::Unwatched => serde_json::json!({"unwatched": true}),
        }
    }

    /// From a tape; a recording made before 0.3's create-first rule holds a bool (true: apply).
    pub fn from_json(v: &Value) -> Existing {
        match v {
            Value::Bool(true) => Existing::Ours(None),
            Value::Bool(false) => Existing::Other,
            Value::Object(m) if m.contains_key("absent") => Existing::Absent,
            Value::Object(m) if m.contains_key("unwatched") => Existing::Unwatched,
            Value::Object(m) if m.contains_key("ours") => {
                Existing::Ours(m["ours"].as_str().map(str::to_string))
            }
            _ => Existing::Other,
        }
    }
}

/// What `existing` (the object under a child's name as JSON; `None`: none is known) is to
/// `parent`: absent, controlled by this incarnation of the primary, or someone else's. An object
/// without a UID (never from the API server) is someone else's: the apply could not carry its
/// precondition.
pub fn classify(existing: Option<&str>, parent: &Parent) -> Existing {
    let Some(body) = existing else {
        return Existing::Absent;
    };
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return Existing::Other;
    };
    let ours = v["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| {
            refs.iter().any(|o| {
                o["controller"].as_bool() == Some(true)
                    && o["uid"].as_str() == Some(parent.uid.as_str())
            })
        });
    match (ours, v["metadata"]["uid"].as_str()) {
        (true, Some(uid)) => Existing::Ours(Some(uid.to_string())),
        _ => Existing::Other,
    }
}

/// A child's body with `uid` as its `metadata.uid`: the API server refuses the apply (409) when
/// the object under that name has another UID.
pub fn with_uid(body: &Value, uid: Option<&str>) -> Value {
    let mut body = body.clone();
    if let (Some(uid), Some(meta)) = (uid, body.get_mut("metadata").and_then(Value::as_object_mut))
    {
        meta.insert("uid".into(), Value::String(uid.to_string()));
    }
    body
}

/// The JSON patch that drops the `Update` entry `manager`'s create left in `object` (the child as
/// its first apply answered, or as read again), so that from then on the manager's fields are its
/// applied ones only: a field the plugin stops sending is removed, and a child applied without
/// force does not conflict with the plugin's own create. Tested against the whole entry at its
/// index and the object's UID, not its resourceVersion: another manager's write in between (a
/// Deployment's status, right after its create) leaves the entry as it was and the patch applies;
/// an entry changed or moved, or another object under the name, makes it fail harmlessly (then
/// read again and retried, [`FORGET_TRIES`]). `None` when there is no such entry or no UID.
pub fn forget_create(object: &str, manager: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(object).ok()?;
    let uid = v["metadata"]["uid"].as_str()?;
    let (index, entry) = v["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .enumerate()
        .find(|(_, f)| {
            f["manager"].as_str() == Some(manager)
                && f["operation"].as_str() == Some("Update")
                && f.get("subresource")
                    .is_none_or(|s| s.as_str().unwrap_or("").is_empty())
        })?;
    Some(serde_json::json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": format!("/metadata/managedFields/{index}"), "value": entry},
        {"op": "remove", "path": format!("/metadata/managedFields/{index}")},
    ]))
}

/// How many times the host tries [`forget_create`]'s patch, reading the child again between tries
/// (the entry moved when another manager's entry was sorted before it).
pub const FORGET_TRIES: usize = 3;

/// The message of the API server's 422 for a JSON patch that does not apply to the object as
/// stored (a `test` failed, a path is missing); a real validation error names the field instead.
pub const PATCH_NOT_APPLIED: &str =
    "the server rejected our request due to an error in our request";

/// Whether an API refusal is that 422: the JSON patch does not apply to the object as stored.
pub fn patch_not_applied(code: u16, message: &str) -> bool {
    code == 422 && message.starts_with(PATCH_NOT_APPLIED)
}

/// The refusal of a child of a kind the plugin does not watch.
pub fn unwatched() -> (u16, &'static str, &'static str) {
    (
        400,
        "InvalidChild",
        "the plugin does not watch this kind, so the host cannot tell whether an object of that name is the primary's: declare the kind with owns()",
    )
}

/// The refusal of a child whose name is taken by an object this primary does not control.
pub fn not_taken_over() -> (u16, &'static str, &'static str) {
    (
        409,
        "AlreadyExists",
        "an object of that name exists and is not controlled by this primary: it is not taken over",
    )
}

/// Whether a listed object is one the plugin (field manager `manager`) applied for this primary:
/// labelled as a member, controlled by the primary's UID, and with fields applied by the manager.
pub fn applied_by(item: &Value, parent: &Parent, manager: &str) -> bool {
    let metadata = &item["metadata"];
    let member = str_at(metadata, &["labels", LABEL_PART_OF]) == Some(parent.id.as_str());
    let controlled = metadata["ownerReferences"].as_array().is_some_and(|refs| {
        refs.iter().any(|o| {
            o["controller"].as_bool() == Some(true)
                && o["uid"].as_str() == Some(parent.uid.as_str())
        })
    });
    // Applied by the plugin's manager, or created by it (the host creates a child before its
    // first apply; should the apply fail, the object still is the plugin's own).
    let applied = metadata["managedFields"].as_array().is_some_and(|fields| {
        fields.iter().any(|f| {
            f["manager"].as_str() == Some(manager)
                && matches!(f["operation"].as_str(), Some("Apply" | "Update"))
        })
    });
    member && controlled && applied
}

/// The items of a List answer, with each one's namespace, name and UID (items without a valid
/// name are left out: nothing is deleted by a name the host would not send).
pub fn listed(body: &str) -> Vec<(Value, Option<String>, String, Option<String>)> {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return Vec::new();
    };
    let Some(items) = v.get("items").and_then(Value::as_array) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let name = str_at(item, &["metadata", "name"])?.to_string();
            if !names::object_name(&name) {
                return None;
            }
            let ns = str_at(item, &["metadata", "namespace"])
                .filter(|ns| names::dns_label(ns))
                .map(str::to_string);
            let uid = str_at(item, &["metadata", "uid"])
                .filter(|u| names::uid(u))
                .map(str::to_string);
            Some((item.clone(), ns, name, uid))
        })
        .collect()
}

/// Members listed per kind and scope (pages of [`LIST_PAGE`]): past it the prune stops with an
/// error rather than hold more in the host's memory.
pub const MAX_LISTED: usize = 2000;
pub const LIST_PAGE: u32 = 250;

/// The `continue` token of a List answer, if there are more pages.
pub fn continue_token(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    let token = v.get("metadata")?.get("continue")?.as_str()?;
    (!token.is_empty() && token.len() <= 4096).then(|| token.to_string())
}

/// Whether an API error for a child is one a retry cannot mend (the reconcile's error is then
/// terminal when every failure is).
pub fn permanent(code: u16) -> bool {
    matches!(code, 400 | 403 | 404 | 405 | 422)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_create_entry_is_found_by_manager_operation_and_no_subresource() {
        let object = json!({"metadata": {"uid": "u-1", "resourceVersion": "7", "managedFields": [
            {"manager": "wcm:p", "operation": "Apply", "fieldsV1": {"f:spec": {}}},
            {"manager": "wcm:p", "operation": "Update", "subresource": "status", "fieldsV1": {}},
            {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {}},
            {"manager": "wcm:p", "operation": "Update", "time": "2026-11-28T01:00:00Z",
             "fieldsV1": {"f:spec": {"f:replicas": {}}}},
        ]}});
        let patch = forget_create(&object.to_string(), "wcm:p").expect("an entry");
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "u-1"},
                {"op": "test", "path": "/metadata/managedFields/3",
                 "value": object["metadata"]["managedFields"][3]},
                {"op": "remove", "path": "/metadata/managedFields/3"},
            ])
        );
        // No resourceVersion test: another manager's write in between does not stop it.
        assert!(!patch.to_string().contains("resourceVersion"));
        assert_eq!(forget_create(&object.to_string(), "wcm:q"), None);
        let no_uid = json!({"metadata": {"managedFields": object["metadata"]["managedFields"]}});
        assert_eq!(forget_create(&no_uid.to_string(), "wcm:p"), None);
        let applied_only = json!({"metadata": {"uid": "u-1", "managedFields": [
            {"manager": "wcm:p", "operation": "Apply"},
            {"manager": "wcm:p", "operation": "Update", "subresource": "status"},
        ]}});
        assert_eq!(forget_create(&applied_only.to_string(), "wcm:p"), None);
        assert_eq!(forget_create("not json", "wcm:p"), None);
    }

    #[test]
    fn the_applyset_id_is_the_one_kubectl_computes() {
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
        let kind = Gvk::new("apps", "v1", "Deployment");
        let ready = prepare(
            &p,
            &kind,
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","labels":{"applyset.kubernetes.io/part-of":"forged"}}}"#,
        )
        .expect("valid");
        assert_eq!(ready.body["metadata"]["namespace"], "team");
        assert_eq!(ready.body["metadata"]["labels"][LABEL_PART_OF], json!(p.id));
        assert_eq!(
            ready.body["metadata"]["ownerReferences"][0]["uid"],
            json!(p.uid)
        );
        assert_eq!(
            ready.body["metadata"]["ownerReferences"][0]["blockOwnerDeletion"],
            true
        );
        for bad in [
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"other"}}"#,
            r#"{"apiVersion":"v1","kind":"Deployment","metadata":{"name":"web"}}"#,
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"../x"}}"#,
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","ownerReferences":[{"controller":true,"uid":"someone-else"}]}}"#,
            r#"[1,2]"#,
        ] {
            assert!(prepare(&p, &kind, bad).is_err(), "{bad} passed");
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
        assert!(applied_by(&ours, &p, "wcm:foo"));
        let mut by_hand = ours.clone();
        by_hand["metadata"]["managedFields"] =
            json!([{"manager": "kubectl", "operation": "Apply"}]);
        assert!(!applied_by(&by_hand, &p, "wcm:foo"));
        let mut other_owner = ours.clone();
        other_owner["metadata"]["ownerReferences"] = json!([{"controller": true, "uid": "x"}]);
        assert!(!applied_by(&other_owner, &p, "wcm:foo"));
        assert!(!applied_by(&ours, &p, "wcm:bar"));
    }

    #[test]
    fn what_the_parent_records_is_read_bounded_and_checked() {
        let many: Vec<String> = (0..100).map(|i| format!("g{i}.io/v1/K")).collect();
        let object = json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n","uid":"0b9d3c1e-1111-2222-3333-444455556666","annotations":{
            ANNOTATION_KINDS: format!("{},bad kind,/v1/ConfigMap", many.join(",")),
            ANNOTATION_NAMESPACES: "a,B,../x,b",
        }}});
        let p = Parent::read(&object.to_string()).expect("read");
        assert_eq!(p.kinds.len(), MAX_KINDS);
        assert_eq!(p.namespaces.len(), 2);
        assert!(p.namespace.is_none());
        // A cluster-scoped parent: recorded namespaces for a namespaced kind, the cluster scope
        // for a cluster-scoped one.
        assert_eq!(p.scopes(Some(false), &p.namespaces), vec![None]);
        assert_eq!(p.scopes(Some(true), &p.namespaces).len(), 2);
    }

    #[test]
    fn the_parent_records_kinds_so_kubectl_and_a_later_prune_find_them() {
        let p = parent();
        let kinds = BTreeSet::from([
            Gvk::new("apps", "v1", "Deployment"),
            Gvk::new("", "v1", "Service"),
        ]);
        let body = p.record_patch("foo", &kinds, &BTreeSet::new());
        assert_eq!(
            body["metadata"]["uid"],
            json!(p.uid),
            "the UID is a precondition"
        );
        let a = &body["metadata"]["annotations"];
        assert_eq!(a[ANNOTATION_GROUP_KINDS], "Deployment.apps,Service");
        assert_eq!(a[ANNOTATION_KINDS], "/v1/Service,apps/v1/Deployment");
        assert_eq!(body["metadata"]["labels"][LABEL_ID], json!(p.id));
        let reread = Parent::read(
            &json!({"apiVersion":"example.com/v1","kind":"Foo","metadata":{"name":"web","namespace":"team","uid":p.uid,"labels":body["metadata"]["labels"],"annotations":a}}).to_string(),
        )
        .expect("read");
        assert_eq!(reread.kinds, kinds);
        assert!(!reread.must_grow(&kinds, &BTreeSet::new()));
        assert_eq!(reread.claimed_by_other("foo"), None);
        assert!(
            reread.claimed_by_other("bar").is_some(),
            "another plugin's set"
        );
    }

    #[test]
    fn membership_does_not_depend_on_the_version_a_kind_is_read_at() {
        // Recorded at v1alpha1 and (forged) at v1beta1; the plugin now returns v1: one version
        // per kind is listed, the wanted one.
        let object = json!({"apiVersion":"example.com/v1","kind":"Foo","metadata":{"name":"web","namespace":"team","uid":"0b9d3c1e-1111-2222-3333-444455556666","annotations":{
            ANNOTATION_KINDS: "example.com/v1alpha1/Database,example.com/v1beta1/Database,/v1/ConfigMap",
            ANNOTATION_NAMESPACES: "elsewhere",
        }}});
        let p = Parent::read(&object.to_string()).expect("read");
        assert_eq!(p.kinds.len(), 2, "{:?}", p.kinds);
        assert!(
            p.namespaces.is_empty(),
            "a namespaced primary records no other namespace"
        );
        let wanted = BTreeSet::from([Gvk::new("example.com", "v1", "Database")]);
        let kinds = p.kinds_with(&wanted);
        assert_eq!(
            kinds,
            BTreeSet::from([
                Gvk::new("example.com", "v1", "Database"),
                Gvk::new("", "v1", "ConfigMap")
            ])
        );
    }

    #[test]
    fn another_tools_applyset_is_not_taken_over() {
        let object = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"parent","namespace":"n","uid":"0b9d3c1e-1111-2222-3333-444455556666","annotations":{
            ANNOTATION_TOOLING: "kubectl/v1.36",
        }}});
        let p = Parent::read(&object.to_string()).expect("read");
        assert!(p.claimed_by_other("foo").is_some());
    }
}
