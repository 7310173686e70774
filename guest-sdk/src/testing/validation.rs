//! The host's own checks of what a plugin hands it, run by [`MockHost`](super::MockHost) before
//! anything else: the same `wcm-validate` code the host runs, so a unit test is refused exactly
//! what the cluster would refuse (`400 BadRequest` with the host's message for an API call; a
//! dropped event and a warning for an event).

use super::ApiCall;
use crate::params::{DeleteParams, ListParams, PatchParams};
use crate::types::{ApiError, ObjectRef, PatchType};
use wcm_validate::Invalid;

fn refused(e: Invalid) -> ApiError {
    ApiError {
        code: wcm_validate::REFUSED_CODE,
        reason: wcm_validate::REFUSED_REASON.into(),
        message: e.to_string(),
    }
}

/// Kind, namespace, name and selectors of a call, as the host's `check_request`.
pub(super) fn call(c: &ApiCall) -> Result<(), ApiError> {
    (|| {
        wcm_validate::kind(&c.kind.group, &c.kind.version, &c.kind.kind)?;
        if let Some(ns) = &c.namespace {
            wcm_validate::namespace(ns)?;
        }
        if let Some(n) = &c.name {
            wcm_validate::name(n)?;
        }
        if let Some(s) = &c.label_selector {
            wcm_validate::label_selector(s)?;
        }
        if let Some(f) = &c.field_selector {
            wcm_validate::field_selector(f)?;
        }
        Ok(())
    })()
    .map_err(refused)
}

/// A list's page size and continue token.
pub(super) fn list(p: &ListParams) -> Result<(), ApiError> {
    (|| {
        if let Some(l) = p.limit {
            wcm_validate::limit(l)?;
        }
        if let Some(t) = &p.continue_token {
            wcm_validate::continue_token(t)?;
        }
        Ok(())
    })()
    .map_err(refused)
}

/// Patch options: `force` only with server-side apply, the field manager suffix.
pub(super) fn patch(patch_type: PatchType, p: &PatchParams) -> Result<(), ApiError> {
    if p.force && patch_type != PatchType::Apply {
        return Err(refused(Invalid::new(
            "force",
            "",
            "does not apply to this call",
        )));
    }
    if let Some(s) = &p.field_manager_suffix {
        wcm_validate::field_manager_suffix(s).map_err(refused)?;
    }
    Ok(())
}

/// Delete preconditions.
pub(super) fn delete(p: &DeleteParams) -> Result<(), ApiError> {
    (|| {
        if let Some(u) = &p.precondition_uid {
            wcm_validate::uid(u)?;
        }
        if let Some(rv) = &p.precondition_resource_version {
            wcm_validate::precondition_resource_version(rv)?;
        }
        Ok(())
    })()
    .map_err(refused)
}

/// An event, as the host's `check_event`: the host drops a refused event (the plugin gets no
/// answer) and warns `event refused: ...` in its log.
pub(super) fn event(regarding: &ObjectRef, reason: &str, action: &str) -> Result<(), String> {
    wcm_validate::event(
        (
            &regarding.kind.group,
            &regarding.kind.version,
            &regarding.kind.kind,
        ),
        regarding.key.namespace.as_deref(),
        &regarding.key.name,
        regarding.uid.as_deref(),
        reason,
        action,
    )
    .map_err(|e| e.to_string())
}
