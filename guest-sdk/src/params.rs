//! Options of API calls, named and built as in kube-rs (`ListParams`, `PatchParams`,
//! `DeleteParams`), sent through `wcm:reconciler@0.2.0`: a plugin built with this SDK needs a host
//! that serves it (this one or later).

/// What a LIST selects, and which page.
///
/// ```
/// use wcm_sdk::ListParams;
/// let lp = ListParams::default().labels("app=web").fields("spec.nodeName=node-1").limit(100);
/// assert_eq!(lp.limit, Some(100));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListParams {
    /// A label selector, e.g. `"app=web,tier!=db"`.
    pub label_selector: Option<String>,
    /// A field selector, e.g. `"spec.nodeName=node-1"` (the fields each kind supports).
    pub field_selector: Option<String>,
    /// At most this many objects per page.
    pub limit: Option<u32>,
    /// The page after the one that returned this token ([`ObjectList::continue_token`](crate::ObjectList)).
    pub continue_token: Option<String>,
}

impl ListParams {
    /// Only objects with these labels.
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_string());
        self
    }

    /// Only objects whose fields match.
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.to_string());
        self
    }

    /// Pages of at most `limit` objects.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The next page.
    pub fn continue_token(mut self, token: &str) -> Self {
        self.continue_token = Some(token.to_string());
        self
    }
}

/// How a PATCH is applied.
///
/// ```
/// use wcm_sdk::PatchParams;
/// let pp = PatchParams::default().field_manager_suffix("labels").force().dry_run();
/// assert!(pp.force && pp.dry_run);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PatchParams {
    /// Appended to the plugin's name to make the field manager (`wcm:NAME:SUFFIX`; without one,
    /// `wcm:NAME`): a plugin that applies two sets of fields owns them separately. 1-60 lowercase
    /// letters, digits and `-`.
    pub field_manager_suffix: Option<String>,
    /// Server-side apply only: take over fields another manager owns (else a conflict is a 409).
    pub force: bool,
    /// Validated and answered by the API server, but not stored.
    pub dry_run: bool,
}

impl PatchParams {
    /// A field manager of the plugin's own: `wcm:NAME:SUFFIX`.
    pub fn field_manager_suffix(mut self, suffix: &str) -> Self {
        self.field_manager_suffix = Some(suffix.to_string());
        self
    }

    /// Take over fields another manager owns (server-side apply).
    pub fn force(mut self) -> Self {
        self.force = true;
        self
    }

    /// Ask the API server what would happen, without storing anything.
    pub fn dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }
}

/// What happens to an object's dependents when it is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Dependents are deleted in the background.
    Background,
    /// The object stays until its dependents are gone.
    Foreground,
    /// Dependents are left, their owner references removed.
    Orphan,
}

/// How a DELETE is made.
///
/// ```
/// use wcm_sdk::{DeleteParams, Propagation};
/// let dp = DeleteParams::default().propagation(Propagation::Foreground).precondition_uid("u-1");
/// assert_eq!(dp.precondition_uid.as_deref(), Some("u-1"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteParams {
    /// What happens to dependents; `None`: the kind's default.
    pub propagation: Option<Propagation>,
    /// Delete only this incarnation of the object (409 when the UID differs).
    pub precondition_uid: Option<String>,
    /// Delete only if the object is still at this resourceVersion (409 otherwise).
    pub precondition_resource_version: Option<String>,
    /// Validated and answered by the API server, but nothing is deleted.
    pub dry_run: bool,
}

impl DeleteParams {
    /// What happens to dependents.
    pub fn propagation(mut self, p: Propagation) -> Self {
        self.propagation = Some(p);
        self
    }

    /// Only this incarnation (UID) of the object.
    pub fn precondition_uid(mut self, uid: &str) -> Self {
        self.precondition_uid = Some(uid.to_string());
        self
    }

    /// Only if the object is still at this resourceVersion.
    pub fn precondition_resource_version(mut self, rv: &str) -> Self {
        self.precondition_resource_version = Some(rv.to_string());
        self
    }

    /// Ask the API server what would happen, without deleting.
    pub fn dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }
}
