//! MockHost's side of contract 0.3: the children a reconcile returns are applied and pruned with
//! the host's own steps and decisions (`wcm_rules::applyset`), through MockHost's API calls (so
//! the plugin's declared permissions are checked as the host checks them); the plugin's metrics
//! are kept with the host's rules (`wcm_rules::metrics`).

use std::collections::BTreeSet;

use wcm_rules::applyset::{self, Existing, Gvk, Parent, Prepared};
use wcm_rules::metrics::{Series, Update, Value as MetricValue};

use super::MockHost;
use crate::children::Child;
use crate::host::Host;
use crate::params::{DeleteParams, ListParams, PatchParams, Propagation};
use crate::reconcile::{Error, Request};
use crate::types::{ApiError, EventType, KindRef, ObjectKey, ObjectRef, PatchType};

fn kind_ref(k: &Gvk) -> KindRef {
    KindRef::new(&k.group, &k.version, &k.kind)
}

fn parent_ref(p: &Parent) -> ObjectRef {
    ObjectRef {
        kind: kind_ref(&p.kind),
        key: ObjectKey {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
        },
        uid: Some(p.uid.clone()),
    }
}

impl MockHost {
    /// The plugin's field manager, as the host names it (`wcm:NAME`).
    pub(crate) fn field_manager(&self, suffix: Option<&str>) -> String {
        let name = self.plugin_name();
        match suffix {
            Some(s) => format!("wcm:{name}:{s}"),
            None => format!("wcm:{name}"),
        }
    }

    /// Applies `children` for `request`'s primary and prunes what left the set, as the host does
    /// after a reconcile (`host/src/sandbox/children.rs`, same steps); the error the host would
    /// make the reconcile's when a child failed.
    pub(crate) fn settle_children(
        &self,
        request: &Request,
        children: Vec<Child>,
    ) -> Result<(), Error> {
        let Some(object) = &request.object else {
            return Ok(());
        };
        if children.len() > applyset::MAX_CHILDREN {
            return Err(Error::terminal(format!(
                "{} children returned; at most {}",
                children.len(),
                applyset::MAX_CHILDREN
            )));
        }
        let parent = Parent::read(object).map_err(Error::terminal)?;
        let plugin = self.plugin_name();
        if let Some(why) = parent.claimed_by_other(&plugin) {
            self.record_event(
                &parent_ref(&parent),
                EventType::Warning,
                "ChildrenRefused",
                "Apply",
                &why,
            );
            return Err(Error::terminal(why));
        }
        let mut failed: Vec<(String, ApiError)> = Vec::new();
        let mut ready: Vec<(Prepared, bool)> = Vec::new();
        let mut wanted = BTreeSet::new();
        for child in children {
            let kind = Gvk::new(&child.kind.group, &child.kind.version, &child.kind.kind);
            match applyset::prepare(&parent, &kind, &child.object) {
                Ok(p) => {
                    let m = (
                        p.kind.group.clone(),
                        p.kind.kind.clone(),
                        p.namespace.clone(),
                        p.name.clone(),
                    );
                    if wanted.insert(m) {
                        ready.push((p, child.force));
                    } else {
                        failed.push((p.named(), invalid("returned twice")));
                    }
                }
                Err((named, why)) => failed.push((named, invalid(&why))),
            }
        }
        let wanted_kinds: BTreeSet<Gvk> = ready.iter().map(|(r, _)| r.kind.clone()).collect();
        let wanted_namespaces: BTreeSet<String> = ready
            .iter()
            .filter_map(|(r, _)| r.namespace.clone())
            .collect();
        let mut kinds = parent.kinds_with(&wanted_kinds);
        kinds.retain(|k| wanted_kinds.contains(k) || self.declares_kind(&kind_ref(k)));
        let namespaces: BTreeSet<String> = parent
            .namespaces
            .union(&wanted_namespaces)
            .cloned()
            .collect();
        if kinds.len() > applyset::MAX_KINDS || namespaces.len() > applyset::MAX_NAMESPACES {
            return Err(Error::terminal(format!(
                "the children would span more than {} kinds or {} namespaces",
                applyset::MAX_KINDS,
                applyset::MAX_NAMESPACES
            )));
        }
        if parent.must_grow(&wanted_kinds, &wanted_namespaces)
            && let Err(e) = self.write_record(&parent, &kinds, &namespaces)
        {
            let message = format!(
                "recording the ApplySet on the primary (a merge patch of its labels and annotations, which needs patch on the primary's resource) failed: {} {}: {}",
                e.code, e.reason, e.message
            );
            return Err(if applyset::permanent(e.code) {
                Error::terminal(message)
            } else {
                Error::retryable(message)
            });
        }
        let mut failed_kinds: BTreeSet<(String, String)> = BTreeSet::new();
        let mut applied_uids: BTreeSet<String> = BTreeSet::new();
        for (r, force) in &ready {
            let key = ObjectKey {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
            };
            match self.apply_child(&parent, r, &key, *force) {
                Ok(body) => applied_uids.extend(applyset::uid_of(&body)),
                Err(e) => {
                    failed_kinds.insert(r.kind.group_kind());
                    failed.push((r.named(), e));
                }
            }
        }
        let manager = self.field_manager(None);
        let mut left = wanted_kinds.clone();
        let mut prune_failed = false;
        for kind in &kinds {
            if failed_kinds.contains(&kind.group_kind()) {
                left.insert(kind.clone());
                continue;
            }
            let namespaced = match &parent.namespace {
                Some(_) => Some(true),
                None => Some(
                    !super::cluster_scoped(&kind_ref(kind))
                        && !self
                            .state
                            .borrow()
                            .cluster_scoped
                            .contains(&(kind.group.clone(), kind.kind.clone())),
                ),
            };
            'scopes: for scope in parent.scopes(namespaced, &namespaces) {
                let mut token: Option<String> = None;
                let mut listed = 0usize;
                loop {
                    let params = ListParams {
                        label_selector: Some(parent.selector()),
                        limit: Some(applyset::LIST_PAGE),
                        continue_token: token.take(),
                        ..ListParams::default()
                    };
                    let body = match self.list(&kind_ref(kind), scope.as_deref(), &params) {
                        Ok(body) => body,
                        Err(e) if e.code == 404 => continue 'scopes,
                        Err(e) if applyset::permanent(e.code) => {
                            let message: String = e.message.chars().take(600).collect();
                            self.record_event(
                                &parent_ref(&parent),
                                EventType::Warning,
                                "ChildPruneRefused",
                                "List",
                                &format!(
                                    "{} children cannot be pruned: {} {}: {message}",
                                    kind.kind, e.code, e.reason
                                ),
                            );
                            continue 'scopes;
                        }
                        Err(e) => {
                            prune_failed = true;
                            left.insert(kind.clone());
                            failed.push((format!("pruning {}", kind.kind), e));
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
                        let params = DeleteParams {
                            propagation: Some(Propagation::Background),
                            precondition_uid: uid,
                            ..DeleteParams::default()
                        };
                        let key = ObjectKey {
                            namespace: ns,
                            name: name.clone(),
                        };
                        match self.delete(&kind_ref(kind), &key, &params) {
                            Ok(()) => self.record_event(
                                &parent_ref(&parent),
                                EventType::Normal,
                                "ChildPruned",
                                "Delete",
                                &format!(
                                    "{} {} is no longer among the children: deleted",
                                    kind.kind,
                                    wcm_rules::shown(&name)
                                ),
                            ),
                            Err(e) if e.code == 404 || e.code == 409 => {}
                            Err(e) => {
                                prune_failed = true;
                                left.insert(kind.clone());
                                failed.push((
                                    format!("pruning {} {}", kind.kind, wcm_rules::shown(&name)),
                                    e,
                                ));
                            }
                        }
                    }
                    token = applyset::continue_token(&body);
                    if token.is_none() {
                        break;
                    }
                    if listed >= applyset::MAX_LISTED {
                        prune_failed = true;
                        left.insert(kind.clone());
                        failed.push((
                            format!("pruning {}", kind.kind),
                            invalid(&format!(
                                "more than {} objects carry this primary's member label: pruning stops there",
                                applyset::MAX_LISTED
                            )),
                        ));
                        break;
                    }
                }
            }
        }
        if failed.is_empty() && !prune_failed && (left != kinds || wanted_namespaces != namespaces)
        {
            let _ = self.write_record(&parent, &left, &wanted_namespaces);
        }
        if failed.is_empty() {
            return Ok(());
        }
        for (child, e) in &failed {
            let message: String = e.message.chars().take(600).collect();
            self.record_event(
                &parent_ref(&parent),
                EventType::Warning,
                "ChildFailed",
                "Apply",
                &format!("{child}: {} {}: {message}", e.code, e.reason),
            );
        }
        let terminal = failed.iter().all(|(_, e)| applyset::permanent(e.code));
        let summary: Vec<String> = failed
            .iter()
            .take(8)
            .map(|(c, e)| format!("{c}: {} {}", e.code, e.reason))
            .collect();
        let message = format!(
            "{} of the children failed ({}{})",
            failed.len(),
            summary.join("; "),
            if failed.len() > 8 { "; …" } else { "" }
        );
        Err(if terminal {
            Error::terminal(message)
        } else {
            Error::retryable(message)
        })
    }

    /// Whether the declared plugin has any permission on this kind's resource (true when
    /// nothing is declared: `MockHost::new()` checks nothing).
    fn declares_kind(&self, kind: &KindRef) -> bool {
        let st = self.state.borrow();
        let Some(d) = &st.declared else {
            return true;
        };
        let plural = st.plural(kind);
        d.permissions
            .iter()
            .any(|p| p.group == kind.group && (p.resource == plural || p.resource == "*"))
    }

    /// As the host: the primary's own object is applied with its UID as a precondition, someone
    /// else's is refused, and a name the cache does not hold is created first (a 409 then reads
    /// the object to tell the two apart).
    fn apply_child(
        &self,
        parent: &Parent,
        r: &Prepared,
        key: &ObjectKey,
        force: bool,
    ) -> Result<String, ApiError> {
        let kind = kind_ref(&r.kind);
        // The cache of the child's kind (watched by `owns()`), read without a call of the
        // plugin's (no permission check, not recorded), as the host reads its informer cache.
        let watched = self
            .state
            .borrow()
            .watches(&kind)
            .is_none_or(|w| !w.is_empty());
        let mut created = false;
        let mut known = if watched {
            applyset::classify(self.cache_get(&kind, key).as_deref(), parent)
        } else if self.declares_kind(&kind) {
            Existing::Unwatched
        } else {
            // Not even declared: the create is refused (403 NotDeclared), as by the host.
            Existing::Absent
        };
        if known == Existing::Absent {
            known = match self.create(&kind, key.namespace.as_deref(), &r.body.to_string()) {
                Ok(body) => match applyset::uid_of(&body) {
                    Some(uid) => {
                        created = true;
                        Existing::Ours(Some(uid))
                    }
                    None => Existing::Other,
                },
                Err(e) if e.code == 409 => applyset::classify(Some(&self.get(&kind, key)?), parent),
                Err(e) => return Err(e),
            };
        }
        let uid = match known {
            Existing::Ours(uid) => uid,
            Existing::Unwatched => {
                let (code, reason, message) = applyset::unwatched();
                return Err(ApiError::new(code, reason, message));
            }
            _ => {
                let (code, reason, message) = applyset::not_taken_over();
                return Err(ApiError::new(code, reason, message));
            }
        };
        let params = PatchParams {
            force,
            ..PatchParams::default()
        };
        let applied = self.patch(
            &kind,
            key,
            PatchType::Apply,
            &applyset::with_uid(&r.body, uid.as_deref()).to_string(),
            &params,
        )?;
        // As the host: the create's `Update` entry is dropped after the first apply.
        if created && let Some(patch) = applyset::forget_create(&applied, &self.field_manager(None))
        {
            let _ = self.patch(
                &kind,
                key,
                PatchType::Json,
                &patch.to_string(),
                &PatchParams::default(),
            );
        }
        Ok(applied)
    }

    fn write_record(
        &self,
        parent: &Parent,
        kinds: &BTreeSet<Gvk>,
        namespaces: &BTreeSet<String>,
    ) -> Result<String, ApiError> {
        let params = PatchParams {
            field_manager_suffix: Some(applyset::PARENT_MANAGER_SUFFIX.into()),
            force: false,
            dry_run: false,
        };
        let key = ObjectKey {
            namespace: parent.namespace.clone(),
            name: parent.name.clone(),
        };
        self.patch(
            &kind_ref(&parent.kind),
            &key,
            PatchType::Merge,
            &parent
                .record_patch(&self.plugin_name(), kinds, namespaces)
                .to_string(),
            &params,
        )
    }

    /// A metric update, as the host makes it.
    pub(crate) fn update_metric(
        &self,
        update: Update,
        name: &str,
        labels: &[&str],
        value: f64,
    ) -> Result<(), String> {
        let mut st = self.state.borrow_mut();
        let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        match &mut st.metrics {
            Some(series) => series
                .update(update, name, &labels, value)
                .map_err(|(_, why)| why),
            None => Err(format!(
                "metric {} is not declared (the plugin declares no metrics)",
                wcm_rules::shown(name)
            )),
        }
    }

    /// The value of a counter's or gauge's series (`None`: never updated).
    pub fn metric_value(&self, name: &str, labels: &[&str]) -> Option<f64> {
        match self.state.borrow().metrics.as_ref()?.value(name, labels)? {
            MetricValue::Number(n) => Some(*n),
            MetricValue::Histogram { .. } => None,
        }
    }

    /// A histogram series' count and sum (`None`: never observed).
    pub fn histogram(&self, name: &str, labels: &[&str]) -> Option<(u64, f64)> {
        match self.state.borrow().metrics.as_ref()?.value(name, labels)? {
            MetricValue::Histogram { count, sum, .. } => Some((*count, *sum)),
            MetricValue::Number(_) => None,
        }
    }

    /// Metric updates refused so far, by reason (`series-budget`, `wrong-kind`, …), as the host
    /// counts them in `wcm_plugin_metric_updates_refused_total`.
    pub fn metric_refusals(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.state
            .borrow()
            .metrics
            .as_ref()
            .map(Series::refused)
            .unwrap_or_default()
    }

    /// The plugin's series budget (the host's default is 1000; an operator sets
    /// `max_metric_series`).
    pub fn with_metric_series(&self, max: usize) -> &Self {
        let mut st = self.state.borrow_mut();
        st.max_metric_series = Some(max);
        if let Some(d) = &st.declared {
            let decls: Vec<_> = d.metrics.iter().map(crate::metrics::Metric::decl).collect();
            st.metrics = Some(Series::new(&decls, max));
        }
        self
    }
}

fn invalid(message: &str) -> ApiError {
    ApiError::new(400, "InvalidChild", message)
}
