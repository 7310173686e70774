//! The API permissions a plugin declared in `describe`: the first fence of every API call, checked
//! in memory before anything leaves the host. The declared rules are resolved to kinds once, when
//! the plugin loads, so a call on a kind the plugin never declared is refused without discovery or
//! any other request. The API server then checks the same call again under the plugin's identity.

use std::collections::BTreeSet;

use super::api::ApiFailure;
use super::discovery::{Discovery, KindInfo, Resolved};
use super::scope::{Protected, Scope};
use crate::contract::{KindKey, KindRef, Permission};

#[derive(Debug, Clone, Default)]
pub struct Permissions {
    rules: Vec<Permission>,
}

impl Permissions {
    pub fn new(rules: Vec<Permission>) -> Self {
        Permissions { rules }
    }

    /// Whether `verb` on `resource` (plural, with "/subresource" where it applies) of `group` was
    /// declared. "*" matches any verb or resource.
    pub fn allows(&self, group: &str, resource: &str, verb: &str) -> bool {
        self.rules.iter().any(|r| {
            r.group == group
                && (r.resource == resource || r.resource == "*")
                && r.verbs.iter().any(|v| v == verb || v == "*")
        })
    }

    pub fn rules(&self) -> &[Permission] {
        &self.rules
    }

    /// Resolves every declared rule to the kinds it names. A group or resource the API server does
    /// not serve is an error (the plugin waits until it is served). Calls on namespaced kinds are
    /// then allowed only in `scope`.
    pub async fn resolve(
        self,
        discovery: &Discovery,
        scope: Scope,
        protected: Protected,
    ) -> Result<Grants, ApiFailure> {
        let mut kinds: Vec<(String, KindInfo)> = Vec::new();
        let groups: BTreeSet<&str> = self.rules.iter().map(|r| r.group.as_str()).collect();
        for group in groups {
            let g = discovery.group(group).await?;
            for r in self.rules.iter().filter(|r| r.group == group) {
                let base = r.resource.split('/').next().unwrap_or_default();
                let matched: Vec<&KindInfo> = if base == "*" {
                    g.kinds.iter().collect()
                } else {
                    let k = g.by_plural(base).ok_or_else(|| {
                        ApiFailure::new(
                            404,
                            "NotFound",
                            format!(
                                "declared permission names {base:?} in group {group:?}, which the API server does not serve"
                            ),
                        )
                    })?;
                    vec![k]
                };
                for k in matched {
                    if !kinds.iter().any(|(gr, i)| gr == group && i.kind == k.kind) {
                        kinds.push((group.to_string(), k.clone()));
                    }
                }
            }
        }
        Ok(Grants {
            permissions: self,
            kinds,
            scope,
            protected,
        })
    }
}

/// Declared permissions resolved to kinds.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    permissions: Permissions,
    kinds: Vec<(String, KindInfo)>,
    /// Where calls on namespaced kinds may go.
    scope: Scope,
    /// Namespaces whose Namespace object it may not write either, unless its scope names them.
    protected: Protected,
}

/// Why a call did not pass the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Never declared: 403.
    Undeclared { resource: String },
    /// Declared, but not in this namespace (or across all namespaces): 403.
    OutOfScope {
        resource: String,
        /// None: the call names no namespace (all of them).
        namespace: Option<String>,
    },
    /// Declared, but not at this version, or no such subresource: 404.
    NotServed(String),
}

impl Grants {
    pub fn permissions(&self) -> &Permissions {
        &self.permissions
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Whether any declared rule names this kind (whatever the verb).
    pub fn covers(&self, kind: &KindKey) -> bool {
        self.kinds
            .iter()
            .any(|(g, k)| *g == kind.group && k.kind == kind.kind)
    }

    /// Checks one call against the declaration and the plugin's scope, in memory. `namespace` is
    /// the call's (None: a cluster-scoped object, or all namespaces); `name` its object's.
    pub fn check(
        &self,
        kind: &KindRef,
        subresource: Option<&str>,
        verb: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Result<Resolved, Refusal> {
        let Some((_, info)) = self
            .kinds
            .iter()
            .find(|(g, k)| *g == kind.group && k.kind == kind.kind)
        else {
            return Err(Refusal::Undeclared {
                resource: kind.kind.to_ascii_lowercase(),
            });
        };
        let resource = match subresource {
            Some(sub) => format!("{}/{sub}", info.plural),
            None => info.plural.clone(),
        };
        if !self.permissions.allows(&kind.group, &resource, verb) {
            return Err(Refusal::Undeclared { resource });
        }
        if info.namespaced {
            // Across all namespaces (no namespace) would reach the protected ones: a plugin reads
            // across namespaces from its cache, where its watches put what it may see.
            let allowed = namespace.is_some_and(|ns| self.scope.allows(ns));
            if !allowed {
                return Err(Refusal::OutOfScope {
                    resource,
                    namespace: namespace.map(str::to_string),
                });
            }
        } else if kind.group.is_empty()
            && info.plural == "namespaces"
            && !matches!(verb, "get" | "list" | "watch")
            && let Some(ns) = name
            && self.protected.contains(ns)
            && !self.scope.allows(ns)
        {
            // A protected namespace's own object (deleting it takes the host with it).
            return Err(Refusal::OutOfScope {
                resource,
                namespace: Some(ns.to_string()),
            });
        }
        if !info.versions.contains(&kind.version) {
            return Err(Refusal::NotServed(format!(
                "{} is not served at version {} (served: {})",
                info.plural,
                kind.version,
                info.versions.join(", ")
            )));
        }
        if let Some(sub) = subresource
            && !info.subresources.iter().any(|s| s == sub)
        {
            return Err(Refusal::NotServed(format!(
                "{} has no {sub} subresource",
                info.plural
            )));
        }
        Ok(Resolved::new(kind, info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(group: &str, resource: &str, verbs: &[&str]) -> Permission {
        Permission {
            group: group.into(),
            resource: resource.into(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn info(kind: &str, plural: &str, subs: &[&str]) -> KindInfo {
        KindInfo {
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
            versions: vec!["v1".into()],
            subresources: subs.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn k(group: &str, version: &str, kind: &str) -> KindRef {
        KindRef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
        }
    }

    #[test]
    fn only_declared_calls_pass() {
        let perms = Permissions::new(vec![
            p("", "nodes", &["get", "patch"]),
            p("samplecrd.k8s.io", "networks/status", &["*"]),
        ]);
        assert!(perms.allows("", "nodes", "patch"));
        assert!(!perms.allows("", "nodes", "delete"));
        assert!(!perms.allows("", "pods", "get"));
        assert!(
            !perms.allows("apps", "nodes", "get"),
            "the group must match"
        );
        assert!(perms.allows("samplecrd.k8s.io", "networks/status", "patch"));
        assert!(
            !perms.allows("samplecrd.k8s.io", "networks", "patch"),
            "a subresource grant is not the resource"
        );
    }

    #[test]
    fn the_fence_knows_kinds_versions_and_subresources() {
        let grants = Grants {
            permissions: Permissions::new(vec![
                p("", "configmaps", &["get"]),
                p("samplecrd.k8s.io", "networks/status", &["patch"]),
            ]),
            kinds: vec![
                ("".into(), info("ConfigMap", "configmaps", &[])),
                (
                    "samplecrd.k8s.io".into(),
                    info("Network", "networks", &["status"]),
                ),
            ],
            scope: Scope::Namespaces {
                namespaces: ["team-a".to_string()].into_iter().collect(),
                by_operator: false,
            },
            protected: Protected::default(),
        };
        assert!(
            grants
                .check(&k("", "v1", "ConfigMap"), None, "get", Some("team-a"), None)
                .is_ok()
        );
        assert_eq!(
            grants
                .check(&k("", "v1", "Secret"), None, "get", Some("team-a"), None)
                .err(),
            Some(Refusal::Undeclared {
                resource: "secret".into()
            }),
            "an undeclared kind is refused without knowing its plural"
        );
        assert!(matches!(
            grants.check(
                &k("", "v1", "ConfigMap"),
                None,
                "delete",
                Some("team-a"),
                None
            ),
            Err(Refusal::Undeclared { .. })
        ));
        assert!(matches!(
            grants.check(&k("", "v2", "ConfigMap"), None, "get", Some("team-a"), None),
            Err(Refusal::NotServed(_))
        ));
        assert!(
            grants
                .check(
                    &k("samplecrd.k8s.io", "v1", "Network"),
                    Some("status"),
                    "patch",
                    Some("team-a"),
                    Some("n1")
                )
                .is_ok()
        );
        assert!(matches!(
            grants.check(
                &k("samplecrd.k8s.io", "v1", "Network"),
                None,
                "patch",
                Some("team-a"),
                None
            ),
            Err(Refusal::Undeclared { .. })
        ));
        assert!(grants.covers(&KindKey::from(&k("samplecrd.k8s.io", "v1", "Network"))));
        assert!(!grants.covers(&KindKey::from(&k("", "v1", "Secret"))));
    }

    #[test]
    fn a_declared_call_outside_the_plugins_namespaces_is_refused() {
        let scoped = |scope: Scope| Grants {
            permissions: Permissions::new(vec![
                p("", "configmaps", &["get", "list", "patch"]),
                p("", "nodes", &["patch"]),
                p("", "namespaces", &["get", "patch", "delete"]),
            ]),
            kinds: vec![
                ("".into(), info("ConfigMap", "configmaps", &[])),
                (
                    "".into(),
                    KindInfo {
                        namespaced: false,
                        ..info("Node", "nodes", &[])
                    },
                ),
                (
                    "".into(),
                    KindInfo {
                        namespaced: false,
                        ..info("Namespace", "namespaces", &[])
                    },
                ),
            ],
            scope,
            protected: Protected::new(["wcm-system".to_string()]),
        };
        let cm = k("", "v1", "ConfigMap");
        let team_a = scoped(Scope::Namespaces {
            namespaces: ["team-a".to_string()].into_iter().collect(),
            by_operator: true,
        });
        assert!(
            team_a
                .check(&cm, None, "patch", Some("team-a"), None)
                .is_ok()
        );
        assert_eq!(
            team_a
                .check(&cm, None, "patch", Some("wcm-system"), None)
                .err(),
            Some(Refusal::OutOfScope {
                resource: "configmaps".into(),
                namespace: Some("wcm-system".into())
            })
        );
        assert!(
            matches!(
                team_a.check(&cm, None, "list", None, None),
                Err(Refusal::OutOfScope {
                    namespace: None,
                    ..
                })
            ),
            "a list across all namespaces reaches beyond team-a"
        );
        assert!(
            team_a
                .check(&k("", "v1", "Node"), None, "patch", None, None)
                .is_ok(),
            "cluster-scoped kinds have no namespace to check"
        );
        let namespace = k("", "v1", "Namespace");
        assert!(
            team_a
                .check(&namespace, None, "patch", None, Some("team-b"))
                .is_ok()
        );
        assert!(
            team_a
                .check(&namespace, None, "delete", None, Some("wcm-system"))
                .is_err(),
            "the protected namespace's own object is out of reach"
        );
        assert!(
            team_a
                .check(&namespace, None, "get", None, Some("wcm-system"))
                .is_ok(),
            "reading it is not acting in it"
        );
        let everywhere = scoped(Scope::AllExcept(Protected::new(["wcm-system".to_string()])));
        assert!(
            everywhere
                .check(&cm, None, "patch", Some("team-b"), None)
                .is_ok()
        );
        assert!(
            everywhere
                .check(&cm, None, "patch", Some("wcm-system"), None)
                .is_err(),
            "never the host's namespace unless named"
        );
        assert!(
            everywhere.check(&cm, None, "list", None, None).is_err(),
            "a list across all namespaces would read the protected ones"
        );
        assert!(everywhere.check(&cm, None, "patch", None, None).is_err());
    }
}
