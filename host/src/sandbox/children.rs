//! The children a reconcile returns (contract 0.3): applied with server-side apply under the
//! plugin's field manager, owned by the primary, members of the primary's ApplySet (KEP-3659),
//! and pruned when they leave the set. The steps and decisions are `wcm_rules::applyset`'s
//! (shared with the SDK's MockHost); this is their async run in a call.
//!
//! Every step is an API call of the plugin's own, made through the same host functions as its
//! other calls (`host_calls.rs`): the plugin's declared permissions, its RBAC identity, its API
//! budget, its host-call cap, the call's wall time and its recording apply to them as to any
//! call it makes itself.

use std::collections::BTreeSet;

use wcm_rules::applyset::{self, Existing, Gvk, Parent, Prepared};

use super::call_ctx::CallCtx;
use crate::cluster::api::CallOptions;
use crate::contract::validate;
use crate::contract::wcm::reconciler::{client, events};
use crate::contract::{
    Action, ApiError, KindKey, KindRef, ObjectKey, Outcome, ReconcileError, Request,
};

fn kind_ref(k: &Gvk) -> KindRef {
    KindRef {
        group: k.group.clone(),
        version: k.version.clone(),
        kind: k.kind.clone(),
    }
}

fn gvk(k: &KindRef) -> Gvk {
    Gvk::new(&k.group, &k.version, &k.kind)
}

fn parent_key(p: &Parent) -> ObjectKey {
    ObjectKey {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
    }
}

/// A member as the set knows it: group, kind, namespace and name (not the version).
type Member = (String, String, Option<String>, String);

fn member(r: &Prepared) -> Member {
    (
        r.kind.group.clone(),
        r.kind.kind.clone(),
        r.namespace.clone(),
        r.name.clone(),
    )
}

/// What went wrong with one child (or one prune).
struct Failed {
    child: String,
    error: ApiError,
}

fn invalid(child: String, message: String) -> Failed {
    Failed {
        child,
        error: ApiError {
            code: 400,
            reason: "InvalidChild".into(),
            message,
        },
    }
}

fn error_result(
    message: String,
    terminal: bool,
) -> wasmtime::Result<Result<Action, ReconcileError>> {
    Ok(Err(ReconcileError {
        message,
        terminal,
        retry_after_ms: None,
    }))
}

impl CallCtx {
    /// Applies the children of `outcome` for `req`'s primary and prunes the ones gone from the
    /// set; the reconcile's result: its action, or an error naming each child that failed
    /// (retried with the key's backoff, unless every failure is one a retry cannot mend), with
    /// a Warning event on the primary for each.
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
        if children.len() > applyset::MAX_CHILDREN {
            return error_result(
                format!(
                    "{} children returned; at most {}",
                    children.len(),
                    applyset::MAX_CHILDREN
                ),
                true,
            );
        }
        let parent = match Parent::read(object) {
            Ok(p) => p,
            Err(why) => return error_result(why, true),
        };
        let plugin = self.services.plugin_name().to_string();
        if let Some(why) = parent.claimed_by_other(&plugin) {
            self.child_event(&parent, true, "ChildrenRefused", "Apply", why.clone())
                .await?;
            return error_result(why, true);
        }
        let mut failed: Vec<Failed> = Vec::new();
        let mut ready: Vec<(Prepared, bool)> = Vec::new();
        let mut wanted: BTreeSet<Member> = BTreeSet::new();
        for child in children {
            match applyset::prepare(&parent, &gvk(&child.kind), &child.object) {
                Ok(p) => {
                    if wanted.insert(member(&p)) {
                        ready.push((p, child.force));
                    } else {
                        failed.push(invalid(p.named(), "returned twice".into()));
                    }
                }
                Err((named, why)) => failed.push(invalid(named, why)),
            }
        }
        let wanted_kinds: BTreeSet<Gvk> = ready.iter().map(|(r, _)| r.kind.clone()).collect();
        let wanted_namespaces: BTreeSet<String> = ready
            .iter()
            .filter_map(|(r, _)| r.namespace.clone())
            .collect();
        // What the primary records, one version per kind, and only kinds the plugin declared:
        // a kind someone wrote into the primary's annotation is never resolved or listed.
        let mut kinds = parent.kinds_with(&wanted_kinds);
        kinds.retain(|k| {
            wanted_kinds.contains(k) || self.services.covers(&KindKey::from(&kind_ref(k)))
        });
        let namespaces: BTreeSet<String> = parent
            .namespaces
            .union(&wanted_namespaces)
            .cloned()
            .collect();
        if kinds.len() > applyset::MAX_KINDS || namespaces.len() > applyset::MAX_NAMESPACES {
            return error_result(
                format!(
                    "the children would span more than {} kinds or {} namespaces",
                    applyset::MAX_KINDS,
                    applyset::MAX_NAMESPACES
                ),
                true,
            );
        }
        // The primary records a kind before any child of it exists: a crash between the two
        // cannot leave a child that no prune would find.
        if parent.must_grow(&wanted_kinds, &wanted_namespaces)
            && let Err(e) = self.record(&parent, &kinds, &namespaces).await?
        {
            return error_result(
                format!(
                    "recording the ApplySet on the primary (a merge patch of its labels and annotations, which needs patch on the primary's resource) failed: {} {}: {}",
                    e.code, e.reason, e.message
                ),
                applyset::permanent(e.code),
            );
        }
        // Group and kind of the children that failed now: not pruned this time (and kept
        // recorded); UIDs applied now: never deleted by this reconcile.
        let mut failed_kinds: BTreeSet<(String, String)> = BTreeSet::new();
        let mut applied_uids: BTreeSet<String> = BTreeSet::new();
        for (r, force) in &ready {
            let key = ObjectKey {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
            };
            match self.apply_child(&parent, r, key, *force).await? {
                Ok(body) => applied_uids.extend(applyset::uid_of(&body)),
                Err(error) => {
                    failed_kinds.insert(r.kind.group_kind());
                    failed.push(Failed {
                        child: r.named(),
                        error,
                    });
                }
            }
        }
        // Prune: the members of every recorded kind that are no longer wanted.
        let manager = CallOptions::default().field_manager(&plugin);
        let mut left: BTreeSet<Gvk> = wanted_kinds.clone();
        let mut prune_failed = false;
        for kind in &kinds {
            if failed_kinds.contains(&kind.group_kind()) {
                left.insert(kind.clone());
                continue;
            }
            let namespaced = match &parent.namespace {
                Some(_) => Some(true),
                None => self.services.namespaced(&kind_ref(kind)).await,
            };
            'scopes: for scope in parent.scopes(namespaced, &namespaces) {
                let mut token: Option<String> = None;
                let mut listed = 0usize;
                loop {
                    let options = client::ListOptions {
                        label_selector: Some(parent.selector()),
                        field_selector: None,
                        limit: Some(applyset::LIST_PAGE),
                        continue_token: token.take(),
                    };
                    let page =
                        client::Host::list(self, kind_ref(kind), scope.clone(), options).await?;
                    let body = match page {
                        Ok(body) => body,
                        // A scope the kind has no objects in (a cluster-scoped kind listed in a
                        // namespace, say).
                        Err(e) if e.code == 404 => continue 'scopes,
                        // The plugin may not list this kind (any more): its members cannot be
                        // pruned by it, and no retry changes that. Said, and the kind leaves the
                        // record.
                        Err(e) if applyset::permanent(e.code) => {
                            let note = format!(
                                "{} children cannot be pruned: {} {}: {}",
                                kind.kind,
                                e.code,
                                e.reason,
                                validate::truncate(&e.message, 600)
                            );
                            self.child_event(&parent, true, "ChildPruneRefused", "List", note)
                                .await?;
                            continue 'scopes;
                        }
                        Err(error) => {
                            prune_failed = true;
                            left.insert(kind.clone());
                            failed.push(Failed {
                                child: format!("pruning {}", kind.kind),
                                error,
                            });
                            continue 'scopes;
                        }
                    };
                    let items = applyset::listed(&body);
                    listed += items.len();
                    for (item, ns, name, uid) in items {
                        if !applyset::applied_by(&item, &parent, &manager)
                            || wanted.contains(&(
                                kind.group.clone(),
                                kind.kind.clone(),
                                ns.clone(),
                                name.clone(),
                            ))
                            || uid.as_ref().is_some_and(|u| applied_uids.contains(u))
                        {
                            continue;
                        }
                        if let Err(error) = self.prune(&parent, kind, ns, &name, uid).await? {
                            prune_failed = true;
                            left.insert(kind.clone());
                            failed.push(Failed {
                                child: format!("pruning {} {}", kind.kind, validate::shown(&name)),
                                error,
                            });
                        }
                    }
                    token = applyset::continue_token(&body);
                    if token.is_none() {
                        break;
                    }
                    if listed >= applyset::MAX_LISTED {
                        prune_failed = true;
                        left.insert(kind.clone());
                        failed.push(invalid(
                            format!("pruning {}", kind.kind),
                            format!(
                                "more than {} objects carry this primary's member label: pruning stops there",
                                applyset::MAX_LISTED
                            ),
                        ));
                        break;
                    }
                }
            }
        }
        // The record shrinks to what is left once everything succeeded.
        if failed.is_empty() && !prune_failed && (left != kinds || wanted_namespaces != namespaces)
        {
            let _ = self.record(&parent, &left, &wanted_namespaces).await?;
        }
        if failed.is_empty() {
            return Ok(Ok(outcome.action));
        }
        for f in &failed {
            let note = format!(
                "{}: {} {}: {}",
                f.child,
                f.error.code,
                f.error.reason,
                validate::truncate(&f.error.message, 600)
            );
            self.child_event(&parent, true, "ChildFailed", "Apply", note)
                .await?;
        }
        let terminal = failed.iter().all(|f| applyset::permanent(f.error.code));
        let summary: Vec<String> = failed
            .iter()
            .take(8)
            .map(|f| format!("{}: {} {}", f.child, f.error.code, f.error.reason))
            .collect();
        error_result(
            format!(
                "{} of the children failed ({}{})",
                failed.len(),
                summary.join("; "),
                if failed.len() > 8 { "; …" } else { "" }
            ),
            terminal,
        )
    }

    /// Applies one child, never over an object this primary does not control. What the cache
    /// holds under the child's name decides: the primary's own is applied with its UID as a
    /// precondition; someone else's is refused; none (or a kind the plugin does not watch) is
    /// created first, so that an object made in between (which the cache has not seen yet) makes
    /// the create fail rather than the apply take it over; then it is read (as the plugin) to
    /// tell the primary's own from someone else's.
    async fn apply_child(
        &mut self,
        parent: &Parent,
        r: &Prepared,
        key: ObjectKey,
        force: bool,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let kind = kind_ref(&r.kind);
        let mut known = self.cached_existing(parent, &kind, &key);
        let mut created = false;
        if known == Existing::Absent {
            let created_now = client::Host::create(
                self,
                kind.clone(),
                key.namespace.clone(),
                r.body.to_string(),
            )
            .await?;
            known = match created_now {
                Ok(body) => match applyset::uid_of(&body) {
                    Some(uid) => {
                        created = true;
                        Existing::Ours(Some(uid))
                    }
                    None => Existing::Other,
                },
                Err(e) if e.code == 409 => {
                    match client::Host::get(self, kind.clone(), key.clone()).await? {
                        Ok(body) => applyset::classify(Some(&body), parent),
                        Err(e) => return Ok(Err(e)),
                    }
                }
                Err(e) => return Ok(Err(e)),
            };
        }
        let uid = match known {
            Existing::Ours(uid) => uid,
            Existing::Unwatched => {
                let (code, reason, message) = applyset::unwatched();
                return Ok(Err(ApiError {
                    code,
                    reason: reason.into(),
                    message: message.into(),
                }));
            }
            _ => {
                let (code, reason, message) = applyset::not_taken_over();
                return Ok(Err(ApiError {
                    code,
                    reason: reason.into(),
                    message: message.into(),
                }));
            }
        };
        let options = client::PatchOptions {
            field_manager_suffix: None,
            force,
            dry_run: false,
        };
        let applied = client::Host::patch(
            self,
            kind.clone(),
            key.clone(),
            client::PatchType::Apply,
            applyset::with_uid(&r.body, uid.as_deref()).to_string(),
            options,
        )
        .await?;
        // The create left an `Update` entry of the plugin's manager beside the apply's: dropped,
        // so the child's fields are its applied ones only (best effort: a prune accepts either).
        if created && let Ok(body) = &applied {
            self.forget_create(&kind, &key, body).await?;
        }
        Ok(applied)
    }

    /// Drops the `Update` entry a child's create left, tested against the entry itself (see
    /// `applyset::forget_create`). A test that failed because the entry moved (another manager's
    /// write, such as a Deployment's first status, sorted before it) is tried again on the child
    /// read again, while it is still the same object: at most `FORGET_TRIES` patches in all. Any
    /// other answer ends it; the entry then stays, which a prune accepts.
    async fn forget_create(
        &mut self,
        kind: &KindRef,
        key: &ObjectKey,
        applied: &str,
    ) -> wasmtime::Result<()> {
        let manager = self.field_manager();
        let uid = applyset::uid_of(applied);
        let mut object = applied.to_string();
        for tried in 1..=applyset::FORGET_TRIES {
            let Some(patch) = applyset::forget_create(&object, &manager) else {
                return Ok(());
            };
            let patch = patch.to_string();
            // A step of the host's own: never the one that breaks the guest's call limits (the
            // entry's field set can be larger than the child's body; the calls count as the
            // plugin's). Left, which a prune accepts.
            if patch.len() > self.max_string
                || self.host_calls.saturating_add(2) > self.max_host_calls
            {
                return Ok(());
            }
            let options = client::PatchOptions {
                field_manager_suffix: None,
                force: false,
                dry_run: false,
            };
            let answer = client::Host::patch(
                self,
                kind.clone(),
                key.clone(),
                client::PatchType::Json,
                patch,
                options,
            )
            .await?;
            // Tried again only when a test failed (the server's 422 for a patch that does not
            // apply), not for any other refusal.
            let moved =
                matches!(&answer, Err(e) if applyset::patch_not_applied(e.code, &e.message));
            if !moved || tried == applyset::FORGET_TRIES {
                return Ok(());
            }
            object = match client::Host::get(self, kind.clone(), key.clone()).await? {
                Ok(body) if uid.is_some() && applyset::uid_of(&body) == uid => body,
                _ => return Ok(()),
            };
        }
        Ok(())
    }

    /// The plugin's own field manager, `wcm:NAME`.
    fn field_manager(&self) -> String {
        CallOptions::default().field_manager(self.services.plugin_name())
    }

    /// What the plugin's informer cache holds under a child's name (read without a call of the
    /// plugin's; recorded, so a replay takes the same decision). A kind the plugin does not
    /// watch is `Unwatched`: refused, rather than a create and a read on every reconcile.
    fn cached_existing(&mut self, parent: &Parent, kind: &KindRef, key: &ObjectKey) -> Existing {
        let args = serde_json::json!({
            "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
            "key": {"namespace": key.namespace, "name": key.name},
        });
        if let Some(answer) = self.replayed("children.may-apply", &args) {
            return Existing::from_json(&answer);
        }
        let stored = crate::cluster::services::store_key(key);
        let stores = self.services.cache_stores(kind);
        let known = if stores.is_empty() {
            if self.services.covers(&KindKey::from(kind)) {
                Existing::Unwatched
            } else {
                // Not even declared: the create is refused by the host's own check (403
                // NotDeclared), and never reaches the API server.
                Existing::Absent
            }
        } else {
            let existing = stores
                .iter()
                .find_map(|s| s.get(&stored))
                .map(|o| o.json.to_string());
            applyset::classify(existing.as_deref(), parent)
        };
        self.taped("children.may-apply", args, || known.to_json());
        known
    }

    /// Deletes a member that left the set (UID precondition), with a Normal event; gone already
    /// or another incarnation by now is no failure.
    async fn prune(
        &mut self,
        parent: &Parent,
        kind: &Gvk,
        namespace: Option<String>,
        name: &str,
        uid: Option<String>,
    ) -> wasmtime::Result<Result<(), ApiError>> {
        let options = client::DeleteOptions {
            propagation: Some(client::Propagation::Background),
            precondition_uid: uid,
            precondition_resource_version: None,
            dry_run: false,
        };
        let key = ObjectKey {
            namespace,
            name: name.to_string(),
        };
        match client::Host::delete(self, kind_ref(kind), key, options).await? {
            Ok(()) => {
                let note = format!(
                    "{} {} is no longer among the children: deleted",
                    kind.kind,
                    validate::shown(name)
                );
                self.child_event(parent, false, "ChildPruned", "Delete", note)
                    .await?;
                Ok(Ok(()))
            }
            Err(e) if e.code == 404 || e.code == 409 => Ok(Ok(())),
            Err(e) => Ok(Err(e)),
        }
    }

    /// Writes what the primary records of its set (a merge patch with its UID: never creates it,
    /// never writes another incarnation).
    async fn record(
        &mut self,
        parent: &Parent,
        kinds: &BTreeSet<Gvk>,
        namespaces: &BTreeSet<String>,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let options = client::PatchOptions {
            field_manager_suffix: Some(applyset::PARENT_MANAGER_SUFFIX.into()),
            force: false,
            dry_run: false,
        };
        let plugin = self.services.plugin_name().to_string();
        client::Host::patch(
            self,
            kind_ref(&parent.kind),
            parent_key(parent),
            client::PatchType::Merge,
            parent.record_patch(&plugin, kinds, namespaces).to_string(),
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
            kind: kind_ref(&parent.kind),
            key: parent_key(parent),
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
