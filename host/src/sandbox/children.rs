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

use wcm_rules::applyset::{self, Gvk, Parent, Prepared};

use super::call_ctx::CallCtx;
use crate::cluster::api::CallOptions;
use crate::contract::validate;
use crate::contract::wcm::reconciler::{client, events};
use crate::contract::{Action, ApiError, KindRef, ObjectKey, Outcome, ReconcileError, Request};

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
        let mut failed: Vec<Failed> = Vec::new();
        // Each child with its own choice of forcing conflicts.
        let mut ready: Vec<(Prepared, bool)> = Vec::new();
        let mut wanted = BTreeSet::new();
        for child in children {
            match applyset::prepare(&parent, &gvk(&child.kind), &child.object) {
                Ok(p) => {
                    let key = (p.kind.clone(), p.namespace.clone(), p.name.clone());
                    if wanted.insert(key) {
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
        let kinds: BTreeSet<Gvk> = parent.kinds.union(&wanted_kinds).cloned().collect();
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
            && let Err(e) = self.apply_parent(&parent, &kinds, &namespaces).await?
        {
            return error_result(
                format!(
                    "recording the ApplySet on the primary (server-side apply of its labels and annotations, which needs patch on the primary's resource) failed: {} {}: {}",
                    e.code, e.reason, e.message
                ),
                applyset::permanent(e.code),
            );
        }
        // Kinds with a child whose apply failed now: not pruned this time (and kept recorded).
        let mut failed_kinds: BTreeSet<Gvk> = BTreeSet::new();
        for (r, force) in &ready {
            let options = client::PatchOptions {
                field_manager_suffix: None,
                force: *force,
                dry_run: false,
            };
            let key = ObjectKey {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
            };
            let out = client::Host::patch(
                self,
                kind_ref(&r.kind),
                key,
                client::PatchType::Apply,
                r.body.to_string(),
                options,
            )
            .await?;
            if let Err(error) = out {
                failed_kinds.insert(r.kind.clone());
                failed.push(Failed {
                    child: r.named(),
                    error,
                });
            }
        }
        // Prune: the members of every recorded kind that are no longer wanted.
        let manager = CallOptions::default().field_manager(self.services.plugin_name());
        let mut left: BTreeSet<Gvk> = wanted_kinds.clone();
        let mut prune_failed = false;
        for kind in &kinds {
            if failed_kinds.contains(kind) {
                left.insert(kind.clone());
                continue;
            }
            let namespaced = match &parent.namespace {
                Some(_) => Some(true),
                None => self.services.namespaced(&kind_ref(kind)).await,
            };
            for scope in parent.scopes(namespaced, &namespaces) {
                let options = client::ListOptions {
                    label_selector: Some(parent.selector()),
                    field_selector: None,
                    limit: None,
                    continue_token: None,
                };
                let listed = client::Host::list(self, kind_ref(kind), scope, options).await?;
                let body = match listed {
                    Ok(body) => body,
                    // A scope the kind has no objects in (a cluster-scoped kind listed in a
                    // namespace, say).
                    Err(e) if e.code == 404 => continue,
                    // The plugin may not list this kind (any more): its members cannot be
                    // pruned by it, and no retry changes that. Said once, and the kind leaves
                    // the record.
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
                        continue;
                    }
                    Err(error) => {
                        prune_failed = true;
                        left.insert(kind.clone());
                        failed.push(Failed {
                            child: format!("pruning {}", kind.kind),
                            error,
                        });
                        continue;
                    }
                };
                for (item, ns, name, uid) in applyset::listed(&body) {
                    if !applyset::applied_by(&item, &parent, &manager) {
                        continue;
                    }
                    if wanted.contains(&(kind.clone(), ns.clone(), name.clone())) {
                        continue;
                    }
                    let options = client::DeleteOptions {
                        propagation: Some(client::Propagation::Background),
                        precondition_uid: uid,
                        precondition_resource_version: None,
                        dry_run: false,
                    };
                    let key = ObjectKey {
                        namespace: ns,
                        name: name.clone(),
                    };
                    match client::Host::delete(self, kind_ref(kind), key, options).await? {
                        Ok(()) => {
                            let note = format!(
                                "{} {} is no longer among the children: deleted",
                                kind.kind,
                                validate::shown(&name)
                            );
                            self.child_event(&parent, false, "ChildPruned", "Delete", note)
                                .await?;
                        }
                        // Gone already, or another incarnation by now.
                        Err(e) if e.code == 404 || e.code == 409 => {}
                        Err(error) => {
                            prune_failed = true;
                            left.insert(kind.clone());
                            failed.push(Failed {
                                child: format!("pruning {} {}", kind.kind, validate::shown(&name)),
                                error,
                            });
                        }
                    }
                }
            }
        }
        // The record shrinks to what is left once everything succeeded.
        if failed.is_empty() && !prune_failed && (left != kinds || wanted_namespaces != namespaces)
        {
            let _ = self
                .apply_parent(&parent, &left, &wanted_namespaces)
                .await?;
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

    async fn apply_parent(
        &mut self,
        parent: &Parent,
        kinds: &BTreeSet<Gvk>,
        namespaces: &BTreeSet<String>,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let options = client::PatchOptions {
            field_manager_suffix: Some(applyset::PARENT_MANAGER_SUFFIX.into()),
            force: true,
            dry_run: false,
        };
        client::Host::patch(
            self,
            kind_ref(&parent.kind),
            parent_key(parent),
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
