//! JSON merge patch (RFC 7386) and JSON patch (RFC 6902) on `serde_json::Value`, as the API server
//! applies them.

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
