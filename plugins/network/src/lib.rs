//! `network`: keeps each `Network` (`samplecrd.k8s.io/v1`: spec `cidr` and `gateway`) in sync with
//! an OpenStack Neutron network and subnet.
//!
//! - Its Neutron network is found by the tag `k8s-uid-<uid>`. Neutron accepts tags on a network only
//!   after its create, so the create sets the same string as the description, and a network found
//!   by description alone gets its tag: a restart at any point never creates a second one. The name
//!   (`namespace/name`) is for people.
//! - Missing network or subnet: created. Gateway changed: moved together with allocation pools that
//!   leave it out. CIDR changed: the subnet is replaced.
//! - A finalizer holds the object until its subnet and network are deleted (404: already gone).
//! - An invalid spec: condition Invalid, a Warning event, no Neutron call and no retry.
//! - Keystone or Neutron failing: condition Synced=False with the reason, retried with backoff.
//! - Its own status writes do not wake it (the watch ignores status-only changes).
//!
//! Operator settings (`NAME.toml`): `[config] keystone-url`, `neutron-url` (their hosts are the
//! only ones the plugin declares), `project-name`, `user-domain-name`, `project-domain-name`
//! (default `Default`); `[secrets]` either `application-credential-id` and
//! `application-credential-secret`, or `username` and `password`.

pub mod ip;
pub mod neutron;
pub mod types;

use std::time::Duration;

use wcm_sdk::prelude::*;
use wcm_sdk::{Changes, describe_config};

use crate::ip::Cidr;
use crate::neutron::{Cloud, Credentials, Failure, Neutron, id_of};
use crate::types::{Network, NetworkStatus};

pub const FINALIZER: &str = "samplecrd.k8s.io/neutron";
/// Looked at again this often even when nothing changes (Neutron may be changed behind our back).
const RESYNC: Duration = Duration::from_secs(300);

pub struct NetworkPlugin;

impl Reconciler for NetworkPlugin {
    fn describe() -> Description {
        let mut d = Description::new("network", env!("CARGO_PKG_VERSION"))
            .primary(Watch::of::<Network>().ignore_status_changes())
            .resync(RESYNC)
            .workers(4)
            .permission(Permission::new(
                "samplecrd.k8s.io",
                "networks",
                &["get", "patch"],
            ))
            .permission(Permission::new(
                "samplecrd.k8s.io",
                "networks/status",
                &["patch"],
            ));
        for key in [
            "keystone-url",
            "neutron-url",
            "project-name",
            "user-domain-name",
            "project-domain-name",
        ] {
            d = d.config_key(key);
        }
        // Only the endpoints the operator configured: nothing is compiled in.
        for key in ["keystone-url", "neutron-url"] {
            if let Some(url) = describe_config(key)
                && let Some(host) = wcm_sdk::http::authority(&url)
            {
                d = d.outbound_host(host);
            }
        }
        debug_assert_eq!(
            d.primary.as_ref().map(|w| w.changes),
            Some(Changes::IgnoreStatus)
        );
        d
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(network) = req.object::<Network>()? else {
            // Gone: the finalizer made sure Neutron was cleaned up first.
            return Ok(Action::done());
        };
        let api = ctx.api_namespaced::<Network>(req.namespace().unwrap_or_default());
        finalizer(&api, FINALIZER, network, |event| match event {
            FinalizerEvent::Apply(n) => apply(ctx, &api, n),
            FinalizerEvent::Cleanup(n) => cleanup(ctx, &n),
        })
    }
}

/// Reads the operator's settings; a missing one is terminal (NAME.toml must be fixed).
fn cloud(ctx: &Context) -> Result<Cloud, Error> {
    let need = |key: &str| {
        ctx.config(key)
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| Error::terminal(format!("configuration {key} is not set")))
    };
    let keystone = need("keystone-url")?;
    let neutron = need("neutron-url")?;
    let or_default = |key: &str| ctx.config(key).unwrap_or_else(|| "Default".into());
    let credentials = match (
        ctx.secret("application-credential-id"),
        ctx.secret("application-credential-secret"),
        ctx.secret("username"),
        ctx.secret("password"),
    ) {
        (Some(id), Some(secret), _, _) => Credentials::ApplicationCredential { id, secret },
        (_, _, Some(username), Some(password)) => Credentials::Password {
            username,
            password,
            user_domain: or_default("user-domain-name"),
            project: need("project-name")?,
            project_domain: or_default("project-domain-name"),
        },
        _ => {
            return Err(Error::terminal(
                "no credentials: set secrets application-credential-id and application-credential-secret, or username and password",
            ));
        }
    };
    Ok(Cloud {
        keystone,
        neutron,
        credentials,
    })
}

fn regarding(n: &Network) -> ObjectRef {
    ObjectRef::from_obj(n)
}

/// Writes the status when it differs from what the object has (a cleared id is written as null).
fn write_status(api: &Api<Network>, n: &Network, status: NetworkStatus) -> Result<(), Error> {
    wcm_sdk::helpers::write_status_if_changed(api, n, &status)?;
    Ok(())
}

fn apply(ctx: &Context, api: &Api<Network>, n: Network) -> Result<Action, Error> {
    let generation = n.metadata.generation;
    let mut status = n.status.clone().unwrap_or_default();
    status.observed_generation = generation;

    // 1. The spec, checked before anything reaches Neutron.
    let checked = Cidr::parse(n.spec.cidr.trim()).and_then(|cidr| {
        let gateway = cidr.check_gateway(n.spec.gateway.trim())?;
        Ok((cidr, gateway))
    });
    let (cidr, gateway) = match checked {
        Ok(v) => v,
        Err(why) => {
            // One Warning per distinct problem, not one per reconcile.
            let already_said = status
                .condition("Invalid")
                .is_some_and(|c| c.status == "True" && c.message == why);
            status.set("Invalid", true, "InvalidSpec", &why, generation);
            status.set("Ready", false, "InvalidSpec", &why, generation);
            status.set(
                "Synced",
                false,
                "InvalidSpec",
                "not sent to Neutron",
                generation,
            );
            write_status(api, &n, status)?;
            if !already_said {
                ctx.recorder().publish(
                    &regarding(&n),
                    EventType::Warning,
                    "InvalidSpec",
                    "Validate",
                    &why,
                );
            }
            // Retrying cannot help: the next spec change wakes the plugin.
            return Ok(Action::done());
        }
    };
    status.set("Invalid", false, "Valid", "", generation);
    let cloud = cloud(ctx)?;
    let neutron = Neutron::new(ctx, &cloud);

    match sync(ctx, &neutron, &n, &cidr, gateway, &mut status) {
        Ok(()) => {
            status.set(
                "Synced",
                true,
                "Synced",
                "Neutron matches the spec",
                generation,
            );
            let message = format!(
                "network {} subnet {}",
                status.network_id.as_deref().unwrap_or("?"),
                status.subnet_id.as_deref().unwrap_or("?")
            );
            status.set("Ready", true, "Synced", &message, generation);
            write_status(api, &n, status)?;
            Ok(Action::done())
        }
        Err(f) => {
            status.set("Synced", false, f.reason, &f.to_string(), generation);
            // A spec change not carried out (or carried out halfway) is not Ready; a failure on a
            // resync of an unchanged spec leaves Ready as the last sync found it.
            let previous = n.status.as_ref().and_then(|s| s.observed_generation);
            if previous != generation {
                status.set(
                    "Ready",
                    false,
                    f.reason,
                    "the spec is not yet applied in Neutron",
                    generation,
                );
            }
            // Best effort: the error below is what matters, and it is retried.
            let _ = write_status(api, &n, status);
            let message = format!("{}: {}", f.reason, f.error);
            // Every failure is retried with the key's backoff: a refusal may come from a passing
            // state (a quota, a conflict) and credentials may be fixed at any time. One Neutron
            // itself refused is also said in a Warning (repeats join one event series).
            let refused = !f.error.is_retryable() && f.reason != "AuthenticationFailed";
            if refused {
                ctx.recorder().publish(
                    &regarding(&n),
                    EventType::Warning,
                    f.reason,
                    "Sync",
                    &message,
                );
            }
            Err(Error::retryable(message))
        }
    }
}

fn tag_of(n: &Network) -> Result<String, Error> {
    n.metadata
        .uid
        .as_deref()
        .map(|uid| format!("k8s-uid-{uid}"))
        .ok_or_else(|| Error::terminal("the object has no uid"))
}

fn human_name(n: &Network) -> String {
    format!(
        "{}/{}",
        n.metadata.namespace.as_deref().unwrap_or_default(),
        n.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Makes Neutron match the spec; records what it did in `status` and in events.
fn sync(
    ctx: &Context,
    neutron: &Neutron,
    n: &Network,
    cidr: &Cidr,
    gateway: std::net::IpAddr,
    status: &mut NetworkStatus,
) -> Result<(), Failure> {
    let tag = tag_of(n).unwrap_or_default();
    let name = human_name(n);
    let event = |reason: &str, action: &str, note: &str| {
        ctx.recorder()
            .publish(&regarding(n), EventType::Normal, reason, action, note);
    };

    // The network: found by tag, else created. More than one (never made by this plugin, but
    // possible by hand) converges on the oldest.
    let mut networks = neutron.networks_of(&tag)?;
    networks.sort_by(|a, b| {
        let key = |v: &serde_json::Value| v["created_at"].as_str().unwrap_or("").to_string();
        key(a).cmp(&key(b))
    });
    let network_id = match networks.first() {
        Some(net) => id_of(net)?.to_string(),
        None => {
            let net = neutron.create_network(&name, &tag)?;
            let id = id_of(&net)?.to_string();
            event("NetworkCreated", "Create", &format!("Neutron network {id}"));
            id
        }
    };
    for extra in networks.iter().skip(1) {
        if let Ok(id) = id_of(extra) {
            delete_network(neutron, id)?;
            event(
                "DuplicateRemoved",
                "Delete",
                &format!("Neutron network {id} had the same tag"),
            );
        }
    }
    status.network_id = Some(network_id.clone());

    // The subnet: one with the spec's CIDR. Others go first (a new CIDR may overlap the old).
    let subnets = neutron.subnets_of(&network_id)?;
    let wanted = cidr.to_string();
    let mut current = None;
    for s in &subnets {
        let id = id_of(s)?;
        if s["cidr"].as_str() == Some(wanted.as_str()) && current.is_none() {
            current = Some(s.clone());
        } else {
            neutron.delete("subnets", id)?;
            if status.subnet_id.as_deref() == Some(id) {
                status.subnet_id = None;
            }
            event(
                "SubnetReplaced",
                "Delete",
                &format!(
                    "subnet {id} ({}) removed: the spec asks for {wanted}",
                    s["cidr"].as_str().unwrap_or("?")
                ),
            );
        }
    }
    let subnet_id = match current {
        None => {
            let s = neutron.create_subnet(&network_id, &name, &tag, cidr, &gateway.to_string())?;
            let id = id_of(&s)?.to_string();
            event(
                "SubnetCreated",
                "Create",
                &format!("Neutron subnet {id} {wanted} gateway {gateway}"),
            );
            id
        }
        Some(s) => {
            let id = id_of(&s)?.to_string();
            let current_gateway = s["gateway_ip"].as_str().and_then(|g| g.parse().ok());
            if current_gateway != Some(gateway) {
                neutron.move_gateway(&id, gateway, &cidr.pools_without(gateway))?;
                event(
                    "GatewayChanged",
                    "Update",
                    &format!(
                        "subnet {id} gateway {} → {gateway}",
                        s["gateway_ip"].as_str().unwrap_or("none")
                    ),
                );
            }
            id
        }
    };
    status.subnet_id = Some(subnet_id);
    Ok(())
}

fn delete_network(neutron: &Neutron, id: &str) -> Result<(), Failure> {
    for s in neutron.subnets_of(id)? {
        if let Ok(sid) = id_of(&s) {
            neutron.delete("subnets", sid)?;
        }
    }
    neutron.delete("networks", id)
}

fn cleanup(ctx: &Context, n: &Network) -> Result<Action, Error> {
    let tag = tag_of(n)?;
    let cloud = cloud(ctx)?;
    let neutron = Neutron::new(ctx, &cloud);
    let result = neutron.networks_of(&tag).and_then(|networks| {
        for net in &networks {
            if let Ok(id) = id_of(net) {
                delete_network(&neutron, id)?;
                ctx.recorder().publish(
                    &regarding(n),
                    EventType::Normal,
                    "NetworkDeleted",
                    "Delete",
                    &format!("Neutron network {id} and its subnets deleted"),
                );
            }
        }
        Ok(())
    });
    // Until Neutron confirms, the finalizer stays and the deletion is retried.
    result.map_err(|f| Error::retryable(f.to_string()))?;
    Ok(Action::done())
}

wcm_sdk::export_plugin!(NetworkPlugin);

#[cfg(test)]
mod tests;
