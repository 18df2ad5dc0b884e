//! Storage policies: definitions (a name and three fields), a topic's binding to a name, and the
//! resolution of what a topic's retention and placement actually are. Does no I/O.
//!
//! The definitions are the cluster's, kept by the administrative machine (`admin/policies.rs`),
//! because an administrator defines them once for every vnode; a topic keeps only the name it is
//! bound to, in its vnode's metadata. Whatever resolves a binding takes the definitions as an
//! argument ([`PolicyDefinitions`]).
//!
//! The rule from the original system, kept on purpose: a topic bound to a name no definition
//! backs ("unresolved") expires NOTHING under the cluster retention defaults; only the optional
//! `unresolved_policy_max_age_ms` backstop applies. Falling back to the defaults would delete,
//! on every replica and irreversibly, the data a more permissive policy was written to keep.
//! A field omitted from a definition inherits the cluster value; a null field turns the rule off;
//! zero is a real bound.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::command::MetaResponse;
use crate::error::{MetaError, PolicyError};
use crate::model::Topic;
use crate::names::{LABEL_MAX_BYTES, is_valid_name};
use crate::state::MetaState;

pub const FIELD_MAX_AGE_MS: &str = "retention.max_age_ms";
pub const FIELD_MAX_BYTES: &str = "retention.max_bytes";
pub const FIELD_SPREAD_BY: &str = "spread_by";

/// The cluster's policy definitions by name.
pub type PolicyDefinitions = BTreeMap<String, PolicyDefinition>;

/// A policy value as the wire carries it (tag 0 null, 1 integer, 2 string).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyValue {
    Null,
    Int(u64),
    Str(String),
}

/// One `name = value` pair of a define request, unvalidated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyField {
    pub name: String,
    pub value: PolicyValue,
}

/// One field of a definition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicySetting<T> {
    /// Omitted: the cluster value applies.
    #[default]
    Inherit,
    /// Null: the rule is off for this policy.
    Off,
    Value(T),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyDefinition {
    pub max_age_ms: PolicySetting<u64>,
    pub max_bytes: PolicySetting<u64>,
    /// The broker attribute replicas spread over (`rack`, `zone`, ...).
    pub spread_by: PolicySetting<String>,
}

/// Cluster retention (`MALACHI_RETENTION_*`); `None` keeps forever.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionDefaults {
    pub max_age_ms: Option<u64>,
    pub max_bytes: Option<u64>,
    /// The only bound for a topic bound to an undefined policy.
    pub unresolved_policy_max_age_ms: Option<u64>,
}

/// Everything `get_topic_policy` falls back to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyDefaults {
    pub retention: RetentionDefaults,
    pub spread_by: Option<String>,
}

/// Wire code in parentheses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyResolution {
    /// Unbound (0).
    None,
    /// Bound to a defined policy (1).
    Resolved,
    /// Bound to a name with no definition (2).
    Unresolved,
}

/// Where an effective value comes from; wire code in parentheses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FieldOrigin {
    Global,
    Policy,
    UnresolvedBackstop,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectiveField {
    pub name: String,
    pub value: PolicyValue,
    pub origin: FieldOrigin,
}

/// The answer of `get_topic_policy`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPolicyView {
    pub topic: String,
    pub policy: Option<String>,
    pub resolution: PolicyResolution,
    /// Present only when resolved.
    pub definition: Option<PolicyDefinition>,
    /// Always the three known fields, in the order age, bytes, spread_by.
    pub effective: Vec<EffectiveField>,
}

/// The retention a topic's ranges are held to; `None` means no bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectiveRetention {
    pub max_age_ms: Option<u64>,
    /// Applies per range.
    pub max_bytes: Option<u64>,
}

impl PolicyResolution {
    pub fn wire_code(self) -> u8 {
        match self {
            PolicyResolution::None => 0,
            PolicyResolution::Resolved => 1,
            PolicyResolution::Unresolved => 2,
        }
    }
}

impl FieldOrigin {
    pub fn wire_code(self) -> u8 {
        match self {
            FieldOrigin::Global => 0,
            FieldOrigin::Policy => 1,
            FieldOrigin::UnresolvedBackstop => 2,
        }
    }
}

impl PolicyDefinition {
    /// Validates a define request's fields, in order: the first unknown, duplicate or
    /// ill-typed field is named in the error.
    pub fn from_fields(fields: &[PolicyField]) -> Result<PolicyDefinition, PolicyError> {
        let mut definition = PolicyDefinition::default();
        let mut seen = BTreeSet::new();
        for field in fields {
            let name = field.name.as_str();
            if ![FIELD_MAX_AGE_MS, FIELD_MAX_BYTES, FIELD_SPREAD_BY].contains(&name) {
                return Err(PolicyError::UnknownField(field.name.clone()));
            }
            if !seen.insert(name) {
                return Err(PolicyError::DuplicateField(field.name.clone()));
            }
            let invalid = || PolicyError::InvalidField(field.name.clone());
            match name {
                FIELD_MAX_AGE_MS => definition.max_age_ms = integer_setting(&field.value, invalid)?,
                FIELD_MAX_BYTES => definition.max_bytes = integer_setting(&field.value, invalid)?,
                _ => definition.spread_by = string_setting(&field.value, invalid)?,
            }
        }
        Ok(definition)
    }

    /// The set fields in canonical order (age, bytes, spread_by); inherited ones are omitted.
    pub fn to_fields(&self) -> Vec<PolicyField> {
        let mut fields = Vec::new();
        let mut push = |name: &str, value: Option<PolicyValue>| {
            if let Some(value) = value {
                fields.push(PolicyField { name: name.to_string(), value });
            }
        };
        push(FIELD_MAX_AGE_MS, setting_value(&self.max_age_ms, |v| PolicyValue::Int(*v)));
        push(FIELD_MAX_BYTES, setting_value(&self.max_bytes, |v| PolicyValue::Int(*v)));
        push(FIELD_SPREAD_BY, setting_value(&self.spread_by, |v| PolicyValue::Str(v.clone())));
        fields
    }
}

fn integer_setting(
    value: &PolicyValue,
    invalid: impl Fn() -> PolicyError,
) -> Result<PolicySetting<u64>, PolicyError> {
    match value {
        PolicyValue::Null => Ok(PolicySetting::Off),
        PolicyValue::Int(number) => Ok(PolicySetting::Value(*number)),
        PolicyValue::Str(_) => Err(invalid()),
    }
}

fn string_setting(
    value: &PolicyValue,
    invalid: impl Fn() -> PolicyError,
) -> Result<PolicySetting<String>, PolicyError> {
    match value {
        PolicyValue::Null => Ok(PolicySetting::Off),
        PolicyValue::Str(text) if is_valid_attribute(text) => {
            Ok(PolicySetting::Value(text.clone()))
        }
        PolicyValue::Str(_) | PolicyValue::Int(_) => Err(invalid()),
    }
}

/// A broker attribute name: non-empty, bounded, no control characters, no `=` or `,` (they
/// delimit `rack=a,zone=eu-1`).
fn is_valid_attribute(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= LABEL_MAX_BYTES
        && !text.chars().any(|c| c.is_control() || c == '=' || c == ',')
}

fn setting_value<T>(
    setting: &PolicySetting<T>,
    to_value: impl Fn(&T) -> PolicyValue,
) -> Option<PolicyValue> {
    match setting {
        PolicySetting::Inherit => None,
        PolicySetting::Off => Some(PolicyValue::Null),
        PolicySetting::Value(value) => Some(to_value(value)),
    }
}

/// Resolves one field: the policy's setting, or the global value when inherited.
fn resolve<T: Clone>(setting: &PolicySetting<T>, global: Option<T>) -> (Option<T>, FieldOrigin) {
    match setting {
        PolicySetting::Inherit => (global, FieldOrigin::Global),
        PolicySetting::Off => (None, FieldOrigin::Policy),
        PolicySetting::Value(value) => (Some(value.clone()), FieldOrigin::Policy),
    }
}

fn effective_field<T>(
    name: &str,
    (value, origin): (Option<T>, FieldOrigin),
    to_value: impl Fn(T) -> PolicyValue,
) -> EffectiveField {
    let value = value.map_or(PolicyValue::Null, to_value);
    EffectiveField { name: name.to_string(), value, origin }
}

/// How a binding resolves against `definitions`.
pub fn resolve_binding(binding: Option<&str>, definitions: &PolicyDefinitions) -> PolicyResolution {
    match binding {
        None => PolicyResolution::None,
        Some(name) if definitions.contains_key(name) => PolicyResolution::Resolved,
        Some(_) => PolicyResolution::Unresolved,
    }
}

/// Checks a policy name (`[A-Za-z0-9._-]{1,249}`, not `.` or `..`).
pub fn check_policy_name(name: &str) -> Result<(), PolicyError> {
    if is_valid_name(name) { Ok(()) } else { Err(PolicyError::InvalidPolicyName) }
}

impl MetaState {
    /// `get_topic_policy`: the binding, its resolution and every effective value with its origin.
    pub fn topic_policy(
        &self,
        topic: &str,
        definitions: &PolicyDefinitions,
        defaults: &PolicyDefaults,
    ) -> Result<TopicPolicyView, PolicyError> {
        if !is_valid_name(topic) {
            return Err(PolicyError::InvalidTopic);
        }
        let topic = self.topic_by_name(topic).ok_or(PolicyError::NoSuchTopic)?;
        let resolution = self.policy_resolution(topic, definitions);
        let definition = match resolution {
            PolicyResolution::Resolved => {
                topic.policy.as_ref().map(|name| definitions[name].clone())
            }
            PolicyResolution::None | PolicyResolution::Unresolved => None,
        };
        let effective = effective_fields(resolution, definition.as_ref(), defaults);
        Ok(TopicPolicyView {
            topic: topic.name.clone(),
            policy: topic.policy.clone(),
            resolution,
            definition,
            effective,
        })
    }

    pub fn policy_resolution(
        &self,
        topic: &Topic,
        definitions: &PolicyDefinitions,
    ) -> PolicyResolution {
        resolve_binding(topic.policy.as_deref(), definitions)
    }

    /// The retention `topic` is held to under `defaults`.
    pub fn effective_retention(
        &self,
        topic: &Topic,
        definitions: &PolicyDefinitions,
        defaults: &RetentionDefaults,
    ) -> EffectiveRetention {
        let view = effective_fields(
            self.policy_resolution(topic, definitions),
            topic.policy.as_ref().and_then(|name| definitions.get(name)),
            &PolicyDefaults { retention: *defaults, spread_by: None },
        );
        let integer = |field: &EffectiveField| match field.value {
            PolicyValue::Int(number) => Some(number),
            PolicyValue::Null | PolicyValue::Str(_) => None,
        };
        EffectiveRetention { max_age_ms: integer(&view[0]), max_bytes: integer(&view[1]) }
    }

    /// The broker attribute `topic`'s new replicas spread over: its policy's `spread_by`, or
    /// `default` (`MALACHI_LOG_SPREAD_BY`) when the policy leaves it unset or is unresolved.
    pub fn effective_spread_by(
        &self,
        topic: &Topic,
        definitions: &PolicyDefinitions,
        default: Option<String>,
    ) -> Option<String> {
        let definition = topic.policy.as_ref().and_then(|name| definitions.get(name));
        match (self.policy_resolution(topic, definitions), definition) {
            (PolicyResolution::Resolved, Some(definition)) => {
                resolve(&definition.spread_by, default).0
            }
            _ => default,
        }
    }

    /// Binds `topic` to `policy` (or detaches it). The name need not be defined here: the
    /// definitions are the administrative machine's, and the broker checks the name against
    /// them before it proposes this; a definition deleted in between leaves the binding
    /// unresolved, which keeps everything (see the module header).
    pub(crate) fn bind_topic_policy(
        &mut self,
        topic: &str,
        policy: Option<String>,
    ) -> Result<MetaResponse, MetaError> {
        if !is_valid_name(topic) {
            return Err(PolicyError::InvalidTopic.into());
        }
        if let Some(name) = &policy {
            check_policy_name(name)?;
        }
        self.check_owns_name(topic)?;
        let topic_id = *self.topic_ids_by_name.get(topic).ok_or(PolicyError::NoSuchTopic)?;
        let topic = self.topics.get_mut(&topic_id).expect("the name index names live topics");
        let previous = std::mem::replace(&mut topic.policy, policy);
        Ok(MetaResponse::TopicPolicyBound { previous })
    }

    /// Definitions replayed from an older data directory's log or snapshot, waiting to move to
    /// the administrative machine.
    pub fn legacy_policies(&self) -> &PolicyDefinitions {
        &self.legacy_policies
    }

    /// A legacy `DefinePolicy`, as it applied before the definitions moved (validated the
    /// same way, so a replayed log rebuilds what the older broker held).
    pub(crate) fn legacy_define(
        &mut self,
        name: String,
        fields: &[PolicyField],
    ) -> Result<MetaResponse, MetaError> {
        check_policy_name(&name)?;
        let definition = PolicyDefinition::from_fields(fields)?;
        self.legacy_policies.insert(name, definition);
        Ok(MetaResponse::LegacyPolicies)
    }

    /// Names of the topics bound to `policy`, sorted.
    pub fn topics_bound_to(&self, policy: &str) -> Vec<String> {
        self.topic_ids_by_name
            .iter()
            .filter(|(_, topic_id)| self.topics[topic_id].policy.as_deref() == Some(policy))
            .map(|(name, _)| name.clone())
            .collect()
    }
}

fn effective_fields(
    resolution: PolicyResolution,
    definition: Option<&PolicyDefinition>,
    defaults: &PolicyDefaults,
) -> Vec<EffectiveField> {
    let global = &defaults.retention;
    let global_spread = (defaults.spread_by.clone(), FieldOrigin::Global);
    let (age, bytes, spread) = match (resolution, definition) {
        (PolicyResolution::Resolved, Some(definition)) => (
            resolve(&definition.max_age_ms, global.max_age_ms),
            resolve(&definition.max_bytes, global.max_bytes),
            resolve(&definition.spread_by, defaults.spread_by.clone()),
        ),
        (PolicyResolution::Unresolved, _) => (
            (global.unresolved_policy_max_age_ms, FieldOrigin::UnresolvedBackstop),
            (None, FieldOrigin::UnresolvedBackstop),
            global_spread,
        ),
        (PolicyResolution::None, _) | (PolicyResolution::Resolved, None) => {
            assert_eq!(resolution, PolicyResolution::None, "a resolved binding has a definition");
            (
                (global.max_age_ms, FieldOrigin::Global),
                (global.max_bytes, FieldOrigin::Global),
                global_spread,
            )
        }
    };
    vec![
        effective_field(FIELD_MAX_AGE_MS, age, PolicyValue::Int),
        effective_field(FIELD_MAX_BYTES, bytes, PolicyValue::Int),
        effective_field(FIELD_SPREAD_BY, spread, PolicyValue::Str),
    ]
}

#[cfg(test)]
mod tests;
