//! The host functions of `wcm:reconciler@0.1.0`, for plugins built against it: each converts its
//! arguments to the current contract and calls the current implementation (`host_calls.rs`), so
//! both versions get the same checks, limits and recording. What 0.1 lacks means "no option",
//! except server-side apply, which 0.1 always forced.

use super::call_ctx::CallCtx;
use crate::contract::v0_1::wcm::reconciler as old;
use crate::contract::wcm::reconciler::{cache, client, config, events, log};
use crate::contract::{ApiError, KindRef, ObjectKey};

fn kind(k: old::types::KindRef) -> KindRef {
    KindRef {
        group: k.group,
        version: k.version,
        kind: k.kind,
    }
}

fn key(k: old::types::ObjectKey) -> ObjectKey {
    ObjectKey {
        namespace: k.namespace,
        name: k.name,
    }
}

fn old_key(k: ObjectKey) -> old::types::ObjectKey {
    old::types::ObjectKey {
        namespace: k.namespace,
        name: k.name,
    }
}

fn old_error(e: ApiError) -> old::types::ApiError {
    old::types::ApiError {
        code: e.code,
        reason: e.reason,
        message: e.message,
    }
}

type OldResult<T> = wasmtime::Result<Result<T, old::types::ApiError>>;

fn answer<T>(r: wasmtime::Result<Result<T, ApiError>>) -> OldResult<T> {
    r.map(|r| r.map_err(old_error))
}

fn patch_type(p: old::client::PatchType) -> client::PatchType {
    match p {
        old::client::PatchType::Merge => client::PatchType::Merge,
        old::client::PatchType::Json => client::PatchType::Json,
        old::client::PatchType::Strategic => client::PatchType::Strategic,
        old::client::PatchType::Apply => client::PatchType::Apply,
    }
}

fn patch_options(p: old::client::PatchType) -> client::PatchOptions {
    client::PatchOptions {
        field_manager_suffix: None,
        force: p == old::client::PatchType::Apply,
        dry_run: false,
    }
}

impl old::types::Host for CallCtx {}

impl old::client::Host for CallCtx {
    async fn get(&mut self, k: old::types::KindRef, o: old::types::ObjectKey) -> OldResult<String> {
        answer(client::Host::get(self, kind(k), key(o)).await)
    }

    async fn list(
        &mut self,
        k: old::types::KindRef,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> OldResult<String> {
        let options = client::ListOptions {
            label_selector,
            field_selector: None,
            limit: None,
            continue_token: None,
        };
        answer(client::Host::list(self, kind(k), namespace, options).await)
    }

    async fn create(
        &mut self,
        k: old::types::KindRef,
        namespace: Option<String>,
        body: String,
    ) -> OldResult<String> {
        answer(client::Host::create(self, kind(k), namespace, body).await)
    }

    async fn replace(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
        body: String,
    ) -> OldResult<String> {
        answer(client::Host::replace(self, kind(k), key(o), body).await)
    }

    async fn patch(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
        p: old::client::PatchType,
        body: String,
    ) -> OldResult<String> {
        let options = patch_options(p);
        answer(client::Host::patch(self, kind(k), key(o), patch_type(p), body, options).await)
    }

    async fn patch_status(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
        p: old::client::PatchType,
        body: String,
    ) -> OldResult<String> {
        let options = patch_options(p);
        answer(
            client::Host::patch_status(self, kind(k), key(o), patch_type(p), body, options).await,
        )
    }

    async fn delete(&mut self, k: old::types::KindRef, o: old::types::ObjectKey) -> OldResult<()> {
        let options = client::DeleteOptions {
            propagation: None,
            precondition_uid: None,
            precondition_resource_version: None,
            dry_run: false,
        };
        answer(client::Host::delete(self, kind(k), key(o), options).await)
    }
}

impl old::cache::Host for CallCtx {
    async fn get(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
    ) -> wasmtime::Result<Option<String>> {
        cache::Host::get(self, kind(k), key(o)).await
    }

    async fn keys(
        &mut self,
        k: old::types::KindRef,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> wasmtime::Result<Result<Vec<old::types::ObjectKey>, String>> {
        let keys = cache::Host::keys(self, kind(k), namespace, label_selector).await?;
        Ok(keys.map(|keys| keys.into_iter().map(old_key).collect()))
    }

    async fn list(
        &mut self,
        k: old::types::KindRef,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> wasmtime::Result<Result<Vec<String>, String>> {
        cache::Host::list(self, kind(k), namespace, label_selector).await
    }
}

impl old::events::Host for CallCtx {
    async fn record(
        &mut self,
        regarding: old::events::ObjectRef,
        event_type: old::events::EventType,
        reason: String,
        action: String,
        note: String,
    ) -> wasmtime::Result<()> {
        let regarding = events::ObjectRef {
            kind: kind(regarding.kind),
            key: key(regarding.key),
            uid: regarding.uid,
        };
        let event_type = match event_type {
            old::events::EventType::Normal => events::EventType::Normal,
            old::events::EventType::Warning => events::EventType::Warning,
        };
        events::Host::record(self, regarding, event_type, reason, action, note).await
    }
}

impl old::log::Host for CallCtx {
    async fn log(
        &mut self,
        level: old::log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let level = match level {
            old::log::Level::Trace => log::Level::Trace,
            old::log::Level::Debug => log::Level::Debug,
            old::log::Level::Info => log::Level::Info,
            old::log::Level::Warn => log::Level::Warn,
            old::log::Level::Error => log::Level::Error,
        };
        log::Host::log(self, level, message, fields).await
    }
}

impl old::config::Host for CallCtx {
    async fn get(&mut self, k: String) -> wasmtime::Result<Option<String>> {
        config::Host::get(self, k).await
    }

    async fn secret(&mut self, k: String) -> wasmtime::Result<Option<String>> {
        config::Host::secret(self, k).await
    }
}
