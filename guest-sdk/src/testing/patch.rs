//! JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch on
//! `serde_json::Value`, as the API server applies them.

use serde_json::{Map, Value};

/// Applies a JSON merge patch: objects merge recursively, `null` removes a member, anything else
/// (arrays included) replaces.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in members {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The merge key of a list field of the built-in kinds (their `patchMergeKey`), by field name;
/// `None`: the list is replaced. `ports` merges by `containerPort` in a container, by `port`
/// elsewhere (a Service).
fn merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "hostAliases" => "ip",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "topologySpreadConstraints" => "topologyKey",
        "ports" if items.iter().any(|i| i.get("containerPort").is_some()) => "containerPort",
        "ports" => "port",
        _ => return None,
    })
}

/// Lists of values merged as sets (`patchStrategy: merge` on a list of strings).
fn is_set(field: &str) -> bool {
    field == "finalizers"
}

/// Applies a strategic merge patch as the API server does for the built-in kinds: objects merge,
/// `null` removes; lists with a merge key merge item by item (an item with `$patch: delete`
/// removes its match), `finalizers` merges as a set, `$deleteFromPrimitiveList/finalizers` removes
/// from it; other lists are replaced. In a merged list the patch's items come first, in its
/// order, then the ones only the object had (or the order of `$setElementOrder/<list>`).
/// `$patch: replace`, `$patch: delete` on an object and `$retainKeys` are not supported: an error
/// says so, rather than a result the API server would not give.
pub(crate) fn strategic(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    if let Some(directive) = members
        .get("$patch")
        .or(members.get("$retainKeys").map(|_| &Value::Null))
    {
        return Err(format!(
            "the mock does not apply this strategic-merge directive: {}",
            if directive.is_null() {
                "$retainKeys".to_string()
            } else {
                format!("$patch: {directive}")
            }
        ));
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    for (k, v) in members {
        if k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(gone)) = (t.get_mut(field), v) {
                list.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        let order = members
            .get(&format!("$setElementOrder/{k}"))
            .and_then(Value::as_array);
        match (t.get_mut(k), v) {
            (Some(Value::Array(old)), Value::Array(new)) if is_set(k) => {
                let mut merged: Vec<Value> = new.clone();
                merged.extend(old.iter().filter(|x| !new.contains(x)).cloned());
                *old = merged;
            }
            (Some(Value::Array(old)), Value::Array(new)) => match merge_key(k, new) {
                Some(key) => merge_list(old, new, key, order)?,
                None => *old = new.clone(),
            },
            (Some(old), new) => strategic(old, new)?,
            (None, new) => {
                let mut fresh = Value::Null;
                match new {
                    Value::Array(items) => {
                        let mut list = Vec::new();
                        if let Some(key) = merge_key(k, items) {
                            merge_list(&mut list, items, key, order)?;
                        } else {
                            list = items.clone();
                        }
                        fresh = Value::Array(list);
                    }
                    other => strategic(&mut fresh, other)?,
                }
                t.insert(k.clone(), fresh);
            }
        }
    }
    Ok(())
}

fn merge_list(
    old: &mut Vec<Value>,
    new: &[Value],
    key: &str,
    order: Option<&Vec<Value>>,
) -> Result<(), String> {
    let mut rest: Vec<Value> = std::mem::take(old);
    let mut merged = Vec::new();
    for item in new {
        let Some(id) = item.get(key) else {
            return Err(format!("a list item without its merge key {key:?}: {item}"));
        };
        let position = rest.iter().position(|o| o.get(key) == Some(id));
        let matched = position.map(|i| rest.remove(i));
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            continue;
        }
        let mut base = matched.unwrap_or(Value::Null);
        strategic(&mut base, item)?;
        merged.push(base);
    }
    merged.extend(rest);
    if let Some(order) = order {
        let rank = |v: &Value| {
            order
                .iter()
                .position(|o| o.get(key).is_some() && o.get(key) == v.get(key))
                .unwrap_or(usize::MAX)
        };
        merged.sort_by_key(rank);
    }
    *old = merged;
    Ok(())
}

/// Applies a JSON patch atomically: on error `doc` is unchanged.
///
/// Like the API server (evanphx/json-patch), a `test` for `null` passes when the member is absent.
pub(crate) fn json(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    let mut work = doc.clone();
    for (i, op) in ops.iter().enumerate() {
        apply(&mut work, op).map_err(|e| format!("operation {i}: {e}"))?;
    }
    *doc = work;
    Ok(())
}

fn apply(doc: &mut Value, op: &Value) -> Result<(), String> {
    let field = |name: &str| {
        op.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("missing {name:?}"))
    };
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| "missing \"value\"".to_string())
    };
    let path = field("path")?;
    match field("op")? {
        "add" => add(doc, path, value()?),
        "remove" => remove(doc, path).map(drop),
        "replace" => {
            remove(doc, path)?;
            add(doc, path, value()?)
        }
        "move" => {
            let moved = remove(doc, field("from")?)?;
            add(doc, path, moved)
        }
        "copy" => {
            let copied = get(doc, &pointer(field("from")?)?)
                .ok_or("\"from\" does not exist")?
                .clone();
            add(doc, path, copied)
        }
        "test" => {
            let expected = value()?;
            match get(doc, &pointer(path)?) {
                Some(actual) if *actual == expected => Ok(()),
                None if expected.is_null() => Ok(()),
                Some(actual) => Err(format!(
                    "test of {path} failed: found {actual}, expected {expected}"
                )),
                None => Err(format!("test of {path} failed: it does not exist")),
            }
        }
        other => Err(format!("unknown op {other:?}")),
    }
}

fn pointer(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("path {path:?} does not start with '/'"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn get<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        _ => None,
    })
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let tokens = pointer(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    match get_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(a)) if last == "-" => {
            a.push(value);
            Ok(())
        }
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i <= a.len() => {
                a.insert(i, value);
                Ok(())
            }
            _ => Err(format!("add at {path}: index out of range")),
        },
        _ => Err(format!("add at {path}: the parent does not exist")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let tokens = pointer(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        return Err("cannot remove the whole document".into());
    };
    let removed = match get_mut(doc, parent) {
        Some(Value::Object(m)) => m.remove(last),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Some(a.remove(i)),
            _ => None,
        },
        _ => None,
    };
    removed.ok_or_else(|| format!("{path} does not exist"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_merges_lists_by_key_as_the_api_server_does() {
        let mut pod = json!({"metadata": {"finalizers": ["a"]}, "spec": {"containers": [
            {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
            {"name": "side", "image": "side:1"}
        ], "tolerations": [{"key": "x"}]}});
        strategic(
            &mut pod,
            &json!({"metadata": {"finalizers": ["b"]}, "spec": {
                "containers": [
                    {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}]},
                    {"name": "side", "$patch": "delete"},
                    {"name": "new", "image": "new:1"}
                ],
                "tolerations": [{"key": "y"}],
                "$setElementOrder/containers": [{"name": "app"}, {"name": "new"}]
            }}),
        )
        .expect("applies");
        // The patch's items first (env B before A), unless $setElementOrder says otherwise.
        assert_eq!(
            pod,
            json!({"metadata": {"finalizers": ["b", "a"]}, "spec": {"containers": [
            {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]},
            {"name": "new", "image": "new:1"}
        ], "tolerations": [{"key": "y"}]}})
        );
        strategic(
            &mut pod,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .expect("applies");
        assert_eq!(pod["metadata"]["finalizers"], json!(["b"]));
        // What the mock cannot do as the API server does, it refuses.
        for unsupported in [
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
            json!({"spec": {"$patch": "replace", "replicas": 1}}),
        ] {
            assert!(
                strategic(&mut pod.clone(), &unsupported).is_err(),
                "{unsupported}"
            );
        }
        // A merge patch of the same body would have replaced the containers.
        let mut merged = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        merge(
            &mut merged,
            &json!({"spec": {"containers": [{"name": "c"}]}}),
        );
        assert_eq!(merged["spec"]["containers"], json!([{"name": "c"}]));
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge(
            &mut doc,
            &json!({"a": "z", "c": {"f": null}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            doc,
            json!({"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}})
        );
    }

    #[test]
    fn json_patch_operations() {
        let mut doc = json!({"metadata": {"name": "x"}});
        json(
            &mut doc,
            &json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["a"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
                {"op": "add", "path": "/metadata/labels", "value": {"k/v": "1"}},
                {"op": "replace", "path": "/metadata/labels/k~1v", "value": "2"},
                {"op": "copy", "from": "/metadata/name", "path": "/metadata/generateName"},
                {"op": "move", "from": "/metadata/generateName", "path": "/metadata/alias"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": "b"},
                {"op": "remove", "path": "/metadata/finalizers/0"},
            ]),
        )
        .expect("applies");
        assert_eq!(
            doc,
            json!({"metadata": {"name": "x", "alias": "x", "finalizers": ["b"], "labels": {"k/v": "2"}}})
        );
    }

    #[test]
    fn failed_json_patch_changes_nothing() {
        let mut doc = json!({"metadata": {"finalizers": ["a"]}});
        let before = doc.clone();
        let err = json(
            &mut doc,
            &json!([
                {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
                {"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
            ]),
        );
        assert!(err.is_err());
        assert_eq!(doc, before);
        assert!(
            json(
                &mut doc,
                &json!([{"op": "remove", "path": "/metadata/labels"}])
            )
            .is_err()
        );
        assert!(json(&mut doc, &json!({"op": "add"})).is_err());
    }
}
