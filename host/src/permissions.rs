//! The API permissions a plugin declared in `describe`: every API call is checked against them
//! before it leaves the host.

use crate::sandbox::Permission;

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
}
