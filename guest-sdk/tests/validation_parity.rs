//! MockHost refuses what the host refuses: the same table of bad values (wcm-validate's
//! `BAD_INPUTS`, which the host's own unit test feeds to its checks) gets the host's answer here:
//! `400 BadRequest` with the host's message for an API call, a dropped event and a warning.

use wcm_sdk::testing::MockHost;
use wcm_sdk::{
    Context, EventType, Host, KindRef, Level, ListParams, ObjectKey, ObjectRef, PatchParams,
    PatchType,
};
use wcm_validate::{BAD_INPUTS, Field};

fn deployment() -> KindRef {
    KindRef {
        group: "apps".into(),
        version: "v1".into(),
        kind: "Deployment".into(),
    }
}

#[test]
fn mockhost_refuses_every_value_the_host_refuses_with_the_hosts_answer() {
    for (field, value, what) in BAD_INPUTS {
        let host = MockHost::new();
        let mut kind = deployment();
        let (mut ns, mut name) = ("default", "web");
        let mut list = ListParams::default();
        let mut patch = PatchParams::default();
        let (mut reason, mut action, mut uid) = ("Created", "Create", None);
        match field {
            Field::Namespace => ns = value,
            Field::Name => name = value,
            Field::Group => kind.group = value.to_string(),
            Field::Version => kind.version = value.to_string(),
            Field::Kind => kind.kind = value.to_string(),
            Field::LabelSelector => list.label_selector = Some(value.to_string()),
            Field::FieldSelector => list.field_selector = Some(value.to_string()),
            Field::FieldManagerSuffix => patch.field_manager_suffix = Some(value.to_string()),
            Field::EventReason => reason = value,
            Field::EventAction => action = value,
            Field::EventUid => uid = Some(value.to_string()),
        }
        let key = ObjectKey::namespaced(ns, name);
        if matches!(
            field,
            Field::EventReason | Field::EventAction | Field::EventUid
        ) {
            let regarding = ObjectRef {
                kind: kind.clone(),
                key,
                uid,
            };
            host.record_event(&regarding, EventType::Normal, reason, action, "note");
            assert!(host.events().is_empty(), "{field:?} {value:?} recorded");
            let logs = host.logs();
            assert!(
                logs.iter().any(|l| l.level == Level::Warn
                    && l.message
                        .starts_with(&format!("event refused: invalid {what} "))),
                "{field:?} {value:?}: {logs:?}"
            );
            continue;
        }
        let err = match field {
            Field::LabelSelector | Field::FieldSelector => host.list(&kind, Some(ns), &list),
            Field::FieldManagerSuffix => host.patch(&kind, &key, PatchType::Merge, "{}", &patch),
            _ => host.get(&kind, &key),
        }
        .expect_err(&format!("{field:?} {value:?} passed"));
        assert_eq!(
            (err.code, err.reason.as_str()),
            (400, "BadRequest"),
            "{field:?} {value:?}: {err}"
        );
        assert!(
            err.message.starts_with(&format!("invalid {what} ")),
            "{field:?} {value:?}: {err}"
        );
    }
}

/// The newcomer's case: an event without `.action(..)` passes the SDK, and the host drops it.
#[test]
fn an_event_without_an_action_is_dropped_by_mockhost_as_by_the_host() {
    let host = MockHost::new();
    let ctx: Context = host.context();
    let regarding = ObjectRef::new(deployment(), ObjectKey::namespaced("default", "web"));
    ctx.recorder()
        .event(&regarding, "Created")
        .note("no action")
        .publish();
    assert!(host.events().is_empty(), "{:?}", host.events());
    ctx.recorder()
        .event(&regarding, "Created")
        .action("Create")
        .publish();
    assert_eq!(host.events().len(), 1);
}
