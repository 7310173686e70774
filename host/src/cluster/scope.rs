//! Where a plugin acts: the namespaces its declared permissions reach. One answer, used by the
//! in-memory fence on every call and by `rbac` for the Roles it prints, so the two agree.
//!
//! - The operator names the namespaces in `NAME.toml` (`namespaces = [...]`); that is the scope,
//!   protected namespaces included only when named there.
//! - Otherwise a plugin whose namespaced watches all name a namespace acts in those namespaces.
//! - Otherwise (it watches some kind in every namespace) it acts in every namespace except the
//!   protected ones: the plugins' identity namespace and the host's own. RBAC cannot grant "every
//!   namespace but one", so `rbac` prints such a grant only when the operator asks for it
//!   (`--all-namespaces`), and the host's fence keeps the protected namespaces out either way.
//!
//! Reads that follow a watch (its list and watch) are not acts: they go where the watch says.

use std::collections::BTreeSet;

/// Namespaces no plugin acts in unless its `NAME.toml` names them: the plugins' identity
/// namespace (their ServiceAccounts, the host's impersonation target) and the host's own (its
/// Deployment, ServiceAccount and Leases).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protected(BTreeSet<String>);

impl Protected {
    pub fn new<I: IntoIterator<Item = String>>(namespaces: I) -> Self {
        Protected(namespaces.into_iter().collect())
    }

    pub fn contains(&self, namespace: &str) -> bool {
        self.0.contains(namespace)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

impl std::fmt::Display for Protected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.iter().collect();
        f.write_str(&names.join(", "))
    }
}

/// Where one plugin acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Exactly these namespaces: named by the operator, or the ones the plugin watches.
    Namespaces {
        namespaces: BTreeSet<String>,
        /// Named in `NAME.toml` (else derived from the watches).
        by_operator: bool,
    },
    /// Every namespace except the protected ones: the plugin watches some kind everywhere and the
    /// operator named no namespaces.
    AllExcept(Protected),
}

impl Default for Scope {
    /// Nowhere (a plugin that is only being described acts nowhere).
    fn default() -> Self {
        Scope::Namespaces {
            namespaces: BTreeSet::new(),
            by_operator: false,
        }
    }
}

/// One watch as the scope sees it: its namespace (None: all) and whether its kind is namespaced.
#[derive(Debug, Clone, Copy)]
pub struct WatchScope<'a> {
    pub namespace: Option<&'a str>,
    pub namespaced: bool,
}

impl Scope {
    /// The scope of a plugin: `operator` is `namespaces` from its NAME.toml.
    pub fn resolve(
        operator: Option<&[String]>,
        watches: &[WatchScope<'_>],
        protected: &Protected,
    ) -> Scope {
        if let Some(list) = operator {
            return Scope::Namespaces {
                namespaces: list.iter().cloned().collect(),
                by_operator: true,
            };
        }
        let mut namespaces = BTreeSet::new();
        for w in watches.iter().filter(|w| w.namespaced) {
            match w.namespace.filter(|n| !n.is_empty()) {
                Some(ns) if !protected.contains(ns) => {
                    namespaces.insert(ns.to_string());
                }
                Some(_) => {}
                None => return Scope::AllExcept(protected.clone()),
            }
        }
        Scope::Namespaces {
            namespaces,
            by_operator: false,
        }
    }

    /// Whether the plugin may act in `namespace`.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Scope::Namespaces { namespaces, .. } => namespaces.contains(namespace),
            Scope::AllExcept(protected) => !protected.contains(namespace),
        }
    }

    /// Whether it acts in every namespace but the protected ones.
    pub fn is_all(&self) -> bool {
        matches!(self, Scope::AllExcept(_))
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Namespaces { namespaces, .. } if namespaces.is_empty() => {
                f.write_str("no namespace")
            }
            Scope::Namespaces {
                namespaces,
                by_operator,
            } => {
                let names: Vec<&str> = namespaces.iter().map(String::as_str).collect();
                write!(
                    f,
                    "namespaces {} ({})",
                    names.join(", "),
                    if *by_operator {
                        "named in NAME.toml"
                    } else {
                        "the ones it watches"
                    }
                )
            }
            Scope::AllExcept(p) => write!(f, "every namespace except {p}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protected() -> Protected {
        Protected::new(["wcm-system".to_string(), "host-ns".to_string()])
    }

    fn w(namespace: Option<&str>, namespaced: bool) -> WatchScope<'_> {
        WatchScope {
            namespace,
            namespaced,
        }
    }

    #[test]
    fn a_plugin_watching_everywhere_acts_everywhere_but_the_protected_namespaces() {
        let s = Scope::resolve(None, &[w(None, true), w(None, false)], &protected());
        assert!(s.is_all());
        assert!(s.allows("team-a"));
        assert!(!s.allows("wcm-system"), "the plugins' identity namespace");
        assert!(!s.allows("host-ns"), "the host's own namespace");
    }

    #[test]
    fn a_plugin_watching_namespaces_acts_only_there_and_never_in_a_protected_one_by_default() {
        let s = Scope::resolve(
            None,
            &[w(Some("team-a"), true), w(Some("wcm-system"), true)],
            &protected(),
        );
        assert!(s.allows("team-a"));
        assert!(!s.allows("team-b"));
        assert!(
            !s.allows("wcm-system"),
            "watching the host's namespace does not grant acting there"
        );
        let cluster_only = Scope::resolve(None, &[w(None, false)], &protected());
        assert!(
            !cluster_only.allows("team-a"),
            "no namespaced watch: no namespace"
        );
    }

    #[test]
    fn the_operator_names_the_namespaces_protected_ones_included() {
        let named = ["team-b".to_string(), "wcm-system".to_string()];
        let s = Scope::resolve(Some(&named), &[w(None, true)], &protected());
        assert!(s.allows("team-b"));
        assert!(s.allows("wcm-system"), "named by the operator");
        assert!(!s.allows("team-a"));
        assert_eq!(
            s.to_string(),
            "namespaces team-b, wcm-system (named in NAME.toml)"
        );
    }
}
