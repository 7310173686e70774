//! The host functions of `wcm:reconciler@0.2.0`, for plugins built against it. 0.3 left these
//! interfaces as they were, so each call converts its arguments field for field (through serde:
//! the generated types of both versions have the same names and shapes) and calls the current
//! implementation (`host_calls.rs`): both versions get the same checks, limits and recording.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::call_ctx::CallCtx;
use crate::contract::v0_2::wcm::reconciler as old;
use crate::contract::wcm::reconciler::{cache, client, config, events, log, types};

/// One version's value as the other's: same field and variant names.
fn via<A: Serialize, B: DeserializeOwned>(a: A) -> wasmtime::Result<B> {
    let value = serde_json::to_value(a)?;
    Ok(serde_json::from_value(value)?)
}

type OldResult<T> = wasmtime::Result<Result<T, old::types::ApiError>>;

fn answer<T>(r: wasmtime::Result<Result<T, types::ApiError>>) -> OldResult<T> {
    match r? {
        Ok(v) => Ok(Ok(v)),
        Err(e) => Ok(Err(via(e)?)),
    }
}

impl old::types::Host for CallCtx {}

impl old::client::Host for CallCtx {
    async fn get(&mut self, k: old::types::KindRef, o: old::types::ObjectKey) -> OldResult<String> {
        answer(client::Host::get(self, via(k)?, via(o)?).await)
    }

    async fn list(
        &mut self,
        k: old::types::KindRef,
        namespace: Option<String>,
        options: old::client::ListOptions,
    ) -> OldResult<String> {
        answer(client::Host::list(self, via(k)?, namespace, via(options)?).await)
    }

    async fn create(
        &mut self,
        k: old::types::KindRef,
        namespace: Option<String>,
        body: String,
    ) -> OldResult<String> {
        answer(client::Host::create(self, via(k)?, namespace, body).await)
    }

    async fn replace(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
        body: String,
    ) -> OldResult<String> {
        answer(client::Host::replace(self, via(k)?, via(o)?, body).await)
    }

    async fn patch(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
        p: old::client::PatchType,
        body: String,
        options: old::client::PatchOptions,
    ) -> OldResult<String> {
        answer(client::Host::patch(self, via(k)?, via(o)?, via(p)?, body, via(options)?).await)
    }

    async fn patch_status(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
        p: old::client::PatchType,
        body: String,
        options: old::client::PatchOptions,
    ) -> OldResult<String> {
        answer(
            client::Host::patch_status(self, via(k)?, via(o)?, via(p)?, body, via(options)?).await,
        )
    }

    async fn delete(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
        options: old::client::DeleteOptions,
    ) -> OldResult<()> {
        answer(client::Host::delete(self, via(k)?, via(o)?, via(options)?).await)
    }
}

impl old::cache::Host for CallCtx {
    async fn get(
        &mut self,
        k: old::types::KindRef,
        o: old::types::ObjectKey,
    ) -> wasmtime::Result<Option<String>> {
        cache::Host::get(self, via(k)?, via(o)?).await
    }

    async fn keys(
        &mut self,
        k: old::types::KindRef,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> wasmtime::Result<Result<Vec<old::types::ObjectKey>, String>> {
        match cache::Host::keys(self, via(k)?, namespace, label_selector).await? {
            Ok(keys) => Ok(Ok(via(keys)?)),
            Err(e) => Ok(Err(e)),
        }
    }

    async fn list(
        &mut self,
        k: old::types::KindRef,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> wasmtime::Result<Result<Vec<String>, String>> {
        cache::Host::list(self, via(k)?, namespace, label_selector).await
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
        events::Host::record(
            self,
            via(regarding)?,
            via(event_type)?,
            reason,
            action,
            note,
        )
        .await
    }
}

impl old::log::Host for CallCtx {
    async fn log(
        &mut self,
        level: old::log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        log::Host::log(self, via(level)?, message, fields).await
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
