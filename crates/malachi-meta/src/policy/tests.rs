//! Tables for policy definitions (the administrative machine's), deletion, binding (a
//! vnode's) and resolution.

use super::*;
use crate::admin::{AdminCommand, AdminLimits, AdminResponse, AdminState};
use crate::command::MetaCommand;
use crate::testkit::{apply_ok, assert_refused, create};

fn field(name: &str, value: PolicyValue) -> PolicyField {
    PolicyField { name: name.to_string(), value }
}

fn define(name: &str, fields: Vec<PolicyField>) -> AdminCommand {
    AdminCommand::DefinePolicy { name: name.to_string(), fields }
}

fn bind(topic: &str, policy: Option<&str>) -> MetaCommand {
    MetaCommand::BindTopicPolicy { topic: topic.to_string(), policy: policy.map(str::to_string) }
}

/// Deletes `name` as a broker would: with the topics `meta` binds to it.
fn delete(meta: &MetaState, name: &str, force: bool) -> AdminCommand {
    let bound_topics = meta.topics_bound_to(name);
    AdminCommand::DeletePolicy { name: name.to_string(), force, bound_topics }
}

fn admin_ok(admin: &mut AdminState, command: AdminCommand) -> AdminResponse {
    admin.apply(command.clone()).unwrap_or_else(|error| panic!("{command:?}: {error}"))
}

fn admin_refused(admin: &mut AdminState, command: AdminCommand, reason: &str) {
    let before = admin.clone();
    let error = admin.apply(command.clone()).expect_err("refused");
    assert_eq!(error.reason_text(), reason, "{command:?}");
    assert_eq!(admin, &before, "a refusal changes nothing: {command:?}");
}

#[test]
fn from_fields_table() {
    use PolicyValue::{Int, Null, Str};
    let ok = |age, bytes, spread| {
        Ok(PolicyDefinition { max_age_ms: age, max_bytes: bytes, spread_by: spread })
    };
    let cases: Vec<(Vec<PolicyField>, Result<PolicyDefinition, String>)> = vec![
        (vec![], ok(PolicySetting::Inherit, PolicySetting::Inherit, PolicySetting::Inherit)),
        (
            vec![
                field(FIELD_MAX_AGE_MS, Int(0)),
                field(FIELD_MAX_BYTES, Null),
                field(FIELD_SPREAD_BY, Str("rack".into())),
            ],
            ok(PolicySetting::Value(0), PolicySetting::Off, PolicySetting::Value("rack".into())),
        ),
        (
            vec![field(FIELD_SPREAD_BY, Null)],
            ok(PolicySetting::Inherit, PolicySetting::Inherit, PolicySetting::Off),
        ),
        (
            vec![field("retention.max_records", Int(1))],
            Err("unknown_policy_field: retention.max_records".into()),
        ),
        (
            vec![field(FIELD_MAX_AGE_MS, Int(1)), field(FIELD_MAX_AGE_MS, Int(2))],
            Err("duplicate_policy_field: retention.max_age_ms".into()),
        ),
        (
            vec![field(FIELD_MAX_BYTES, Str("1".into()))],
            Err("invalid_policy_field: retention.max_bytes".into()),
        ),
        (
            vec![field(FIELD_MAX_AGE_MS, Str("1d".into()))],
            Err("invalid_policy_field: retention.max_age_ms".into()),
        ),
        (vec![field(FIELD_SPREAD_BY, Int(3))], Err("invalid_policy_field: spread_by".into())),
        (
            vec![field(FIELD_SPREAD_BY, Str("".into()))],
            Err("invalid_policy_field: spread_by".into()),
        ),
        (
            vec![field(FIELD_SPREAD_BY, Str("rack=a".into()))],
            Err("invalid_policy_field: spread_by".into()),
        ),
        (
            vec![field("x", Int(1)), field(FIELD_SPREAD_BY, Int(3))],
            Err("unknown_policy_field: x".into()),
        ),
        (
            vec![field(FIELD_SPREAD_BY, Int(3)), field("x", Int(1))],
            Err("invalid_policy_field: spread_by".into()),
        ),
    ];
    for (fields, expected) in cases {
        let result = PolicyDefinition::from_fields(&fields).map_err(|error| error.reason_text());
        assert_eq!(result, expected, "{fields:?}");
        if let Ok(definition) = result {
            let round_trip = PolicyDefinition::from_fields(&definition.to_fields());
            assert_eq!(round_trip, Ok(definition));
        }
    }
}

#[test]
fn define_replace_and_list_sorted() {
    let mut admin = AdminState::default();
    let age = |ms| vec![field(FIELD_MAX_AGE_MS, PolicyValue::Int(ms))];
    let defined = |replaced| AdminResponse::PolicyDefined { replaced };
    assert_eq!(admin_ok(&mut admin, define("short", age(1))), defined(false));
    assert_eq!(admin_ok(&mut admin, define("long", age(9))), defined(false));
    assert_eq!(admin_ok(&mut admin, define("short", age(2))), defined(true));
    let listed: Vec<(&str, PolicySetting<u64>)> =
        admin.policies().iter().map(|(name, d)| (name.as_str(), d.max_age_ms.clone())).collect();
    assert_eq!(listed, vec![("long", PolicySetting::Value(9)), ("short", PolicySetting::Value(2))]);
}

#[test]
fn define_refusals() {
    let limits = AdminLimits { max_policies: 1, ..AdminLimits::default() };
    let mut admin = AdminState::new(limits, Default::default());
    admin_ok(&mut admin, define("only", vec![]));
    let cases: Vec<(AdminCommand, &str)> = vec![
        (define("", vec![]), "invalid_policy_name"),
        (define("bad name", vec![]), "invalid_policy_name"),
        (define("p", vec![field("nope", PolicyValue::Null)]), "unknown_policy_field: nope"),
        (define("second", vec![]), "invalid_policy: 1 policies are already defined"),
    ];
    for (command, reason) in cases {
        admin_refused(&mut admin, command, reason);
    }
    admin_ok(&mut admin, define("only", vec![field(FIELD_MAX_BYTES, PolicyValue::Int(5))]));
}

#[test]
fn delete_in_use_needs_force_and_leaves_bindings_unresolved() {
    let (mut state, mut admin) = (MetaState::default(), AdminState::default());
    for topic in ["zeta", "alpha", "free"] {
        apply_ok(&mut state, create(topic, None));
    }
    admin_ok(&mut admin, define("keep", vec![]));
    apply_ok(&mut state, bind("zeta", Some("keep")));
    apply_ok(&mut state, bind("alpha", Some("keep")));
    admin_refused(&mut admin, delete(&state, "keep", false), "policy_in_use: alpha, zeta");
    admin_refused(&mut admin, delete(&state, "bad name", true), "invalid_policy_name");
    let response = admin_ok(&mut admin, delete(&state, "keep", true));
    let unresolved_topics = vec!["alpha".to_string(), "zeta".to_string()];
    assert_eq!(response, AdminResponse::PolicyDeleted { existed: true, unresolved_topics });
    let alpha = state.topic_by_name("alpha").expect("topic");
    assert_eq!(state.policy_resolution(alpha, admin.policies()), PolicyResolution::Unresolved);
    let response = admin_ok(&mut admin, delete(&state, "never-defined", false));
    assert_eq!(
        response,
        AdminResponse::PolicyDeleted { existed: false, unresolved_topics: vec![] }
    );
}

#[test]
fn policy_in_use_reason_is_bounded() {
    let topics: Vec<String> = (0..70).map(|index| format!("t{index:02}")).collect();
    let reason = PolicyError::PolicyInUse { topics }.reason_text();
    assert!(reason.starts_with("policy_in_use: t00, t01, "));
    assert!(reason.ends_with("t63 and 6 more"), "{reason}");
}

#[test]
fn bind_table() {
    let mut state = MetaState::default();
    apply_ok(&mut state, create("orders", None));
    // An undefined name is checked by the broker against the administrative machine's
    // definitions; the vnode binds any valid name (one deleted later is unresolved).
    let cases: Vec<(MetaCommand, &str)> = vec![
        (bind("bad topic", Some("p")), "invalid_topic"),
        (bind("orders", Some("bad name")), "invalid_policy_name"),
        (bind("missing", Some("p")), "no_such_topic"),
    ];
    for (command, reason) in cases {
        assert_refused(&mut state, command, reason);
    }
    let steps = [(Some("p"), None), (Some("p"), Some("p")), (None, Some("p")), (None, None)];
    for (policy, previous) in steps {
        let response = apply_ok(&mut state, bind("orders", policy));
        assert_eq!(
            response,
            MetaResponse::TopicPolicyBound { previous: previous.map(str::to_string) }
        );
    }
}

/// (topic, resolution code, has definition, effective fields as (name, value, origin code))
type ViewCase<'a> = (&'a str, u8, bool, Vec<(&'a str, PolicyValue, u8)>);

fn view_fields(view: &TopicPolicyView) -> Vec<(&str, PolicyValue, u8)> {
    view.effective
        .iter()
        .map(|f| (f.name.as_str(), f.value.clone(), f.origin.wire_code()))
        .collect()
}

/// Topics "plain" (unbound), "bound" (to p: age 7, bytes off) and "orphan" (bound to a policy
/// deleted by force), with the cluster defaults they resolve against.
fn resolution_fixture() -> (MetaState, PolicyDefinitions, PolicyDefaults) {
    use PolicyValue::{Int, Null};
    let defaults = PolicyDefaults {
        retention: RetentionDefaults {
            max_age_ms: Some(1000),
            max_bytes: Some(2000),
            unresolved_policy_max_age_ms: Some(5),
        },
        spread_by: Some("zone".into()),
    };
    let (mut state, mut admin) = (MetaState::default(), AdminState::default());
    for topic in ["plain", "bound", "orphan"] {
        apply_ok(&mut state, create(topic, None));
    }
    let p_fields = vec![field(FIELD_MAX_AGE_MS, Int(7)), field(FIELD_MAX_BYTES, Null)];
    admin_ok(&mut admin, define("p", p_fields));
    admin_ok(&mut admin, define("gone", vec![]));
    apply_ok(&mut state, bind("bound", Some("p")));
    apply_ok(&mut state, bind("orphan", Some("gone")));
    admin_ok(&mut admin, delete(&state, "gone", true));
    (state, admin.policies().clone(), defaults)
}

#[test]
fn topic_policy_resolution_table() {
    use PolicyValue::{Int, Null, Str};
    let (state, definitions, defaults) = resolution_fixture();
    let cases: Vec<ViewCase> = vec![
        (
            "plain",
            0,
            false,
            vec![
                (FIELD_MAX_AGE_MS, Int(1000), 0),
                (FIELD_MAX_BYTES, Int(2000), 0),
                (FIELD_SPREAD_BY, Str("zone".into()), 0),
            ],
        ),
        (
            "bound",
            1,
            true,
            vec![
                (FIELD_MAX_AGE_MS, Int(7), 1),
                (FIELD_MAX_BYTES, Null, 1),
                (FIELD_SPREAD_BY, Str("zone".into()), 0),
            ],
        ),
        (
            "orphan",
            2,
            false,
            vec![
                (FIELD_MAX_AGE_MS, Int(5), 2),
                (FIELD_MAX_BYTES, Null, 2),
                (FIELD_SPREAD_BY, Str("zone".into()), 0),
            ],
        ),
    ];
    for (topic, resolution, has_definition, fields) in cases {
        let view = state.topic_policy(topic, &definitions, &defaults).expect("view");
        assert_eq!(view.resolution.wire_code(), resolution, "{topic}");
        assert_eq!(view.definition.is_some(), has_definition, "{topic}");
        assert_eq!(view_fields(&view), fields, "{topic}");
        let topic = state.topic_by_name(topic).expect("topic");
        let retention = state.effective_retention(topic, &definitions, &defaults.retention);
        let expected = |field: &(&str, PolicyValue, u8)| match field.1 {
            Int(value) => Some(value),
            _ => None,
        };
        assert_eq!(
            retention,
            EffectiveRetention {
                max_age_ms: expected(&fields[0]),
                max_bytes: expected(&fields[1])
            }
        );
    }
}

/// The attribute a topic's new replicas spread over: its policy's, else the cluster's.
#[test]
fn spread_by_follows_the_policy_then_the_cluster() {
    use PolicyValue::{Null, Str};
    let (mut state, mut admin) = (MetaState::default(), AdminState::default());
    for topic in ["plain", "racked", "unspread", "inherits", "orphan"] {
        apply_ok(&mut state, create(topic, None));
    }
    admin_ok(&mut admin, define("by-rack", vec![field(FIELD_SPREAD_BY, Str("rack".into()))]));
    admin_ok(&mut admin, define("off", vec![field(FIELD_SPREAD_BY, Null)]));
    admin_ok(&mut admin, define("empty", vec![]));
    for (topic, policy) in
        [("racked", "by-rack"), ("unspread", "off"), ("inherits", "empty"), ("orphan", "none")]
    {
        apply_ok(&mut state, bind(topic, Some(policy)));
    }
    let definitions = admin.policies().clone();
    // (topic, cluster spread_by, effective)
    let cases: &[(&str, Option<&str>, Option<&str>)] = &[
        ("plain", Some("zone"), Some("zone")),
        ("plain", None, None),
        ("racked", Some("zone"), Some("rack")),
        ("racked", None, Some("rack")),
        ("unspread", Some("zone"), None),
        ("inherits", Some("zone"), Some("zone")),
        ("orphan", Some("zone"), Some("zone")),
    ];
    for &(topic, cluster, effective) in cases {
        let found = state.topic_by_name(topic).expect("created");
        let spread = state.effective_spread_by(found, &definitions, cluster.map(str::to_string));
        assert_eq!(spread.as_deref(), effective, "{topic} under {cluster:?}");
    }
}

#[test]
fn an_unresolved_binding_without_backstop_expires_nothing() {
    let (state, definitions, defaults) = resolution_fixture();
    let unresolved_without_backstop =
        RetentionDefaults { unresolved_policy_max_age_ms: None, ..defaults.retention };
    let orphan = state.topic_by_name("orphan").expect("topic");
    let retention = state.effective_retention(orphan, &definitions, &unresolved_without_backstop);
    assert_eq!(retention, EffectiveRetention { max_age_ms: None, max_bytes: None });
    let view = |topic| state.topic_policy(topic, &definitions, &defaults);
    assert_eq!(view("x y"), Err(PolicyError::InvalidTopic));
    assert_eq!(view("nope"), Err(PolicyError::NoSuchTopic));
}

/// A data directory from before the definitions moved: its snapshot's `policies` and its log's
/// `DefinePolicy`/`DeletePolicy` still load, into the legacy definitions the broker moves to the
/// administrative machine; once moved, they are forgotten.
#[test]
fn legacy_definitions_load_and_are_forgotten_once_moved() {
    let mut state = MetaState::default();
    let age = vec![field(FIELD_MAX_AGE_MS, PolicyValue::Int(5))];
    let define = |name: &str, fields| MetaCommand::DefinePolicy { name: name.into(), fields };
    apply_ok(&mut state, define("keep", age.clone()));
    apply_ok(&mut state, define("gone", vec![]));
    apply_ok(&mut state, MetaCommand::DeletePolicy { name: "gone".into(), force: true });
    assert_refused(&mut state, define("bad name", vec![]), "invalid_policy_name");
    let expected = PolicyDefinition::from_fields(&age).unwrap();
    assert_eq!(state.legacy_policies().keys().collect::<Vec<_>>(), ["keep"]);
    // An older snapshot named the field `policies`.
    let mut snapshot: serde_json::Value = serde_json::to_value(&state).unwrap();
    assert!(snapshot.get("policies").is_some());
    snapshot["policies"] = serde_json::json!({ "old": serde_json::to_value(&expected).unwrap() });
    let restored: MetaState = serde_json::from_value(snapshot).unwrap();
    assert_eq!(restored.legacy_policies().get("old"), Some(&expected));
    let names = vec!["keep".to_string()];
    apply_ok(&mut state, MetaCommand::ForgetLegacyPolicies { names });
    assert!(state.legacy_policies().is_empty());
    let fresh = serde_json::to_value(&state).unwrap();
    assert!(fresh.get("policies").is_none(), "a state with none writes no legacy field");
}
