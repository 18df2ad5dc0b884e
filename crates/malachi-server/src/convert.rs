//! Conversions between wire messages and the log API's and metadata's types.

use bytes::Bytes;
use malachi_log::Record;
use malachi_meta::{EffectiveField, FieldOrigin, PolicyResolution, TopicPolicyView};
use malachi_wire::messages::{self, Origin, Resolution, TopicPolicyResponse};
use malachi_wire::{Header, PolicyField, PolicyValue};

pub fn record_from_wire(record: malachi_wire::Record) -> Record {
    Record {
        key: record.key,
        value: record.value,
        headers: record.headers.into_iter().map(|header| (header.name, header.value)).collect(),
        timestamp_ms: record.timestamp_ms,
        tombstone: false,
    }
}

pub fn record_to_wire(record: Record) -> malachi_wire::Record {
    malachi_wire::Record {
        key: record.key,
        value: record.value,
        timestamp_ms: record.timestamp_ms,
        headers: record.headers.into_iter().map(|(name, value)| Header { name, value }).collect(),
    }
}

/// A wire string as text; `None` when absent or not UTF-8 (no such name can exist).
pub fn text(value: &Option<Bytes>) -> Option<String> {
    value.as_ref().and_then(|bytes| std::str::from_utf8(bytes).ok()).map(str::to_string)
}

pub fn text_bytes(value: &str) -> Option<Bytes> {
    Some(Bytes::copy_from_slice(value.as_bytes()))
}

pub fn policy_field_from_wire(field: &PolicyField) -> malachi_meta::PolicyField {
    malachi_meta::PolicyField {
        name: text(&field.name).unwrap_or_default(),
        value: match &field.value {
            PolicyValue::Null => malachi_meta::PolicyValue::Null,
            PolicyValue::Integer(value) => malachi_meta::PolicyValue::Int(*value),
            PolicyValue::String(bytes) => {
                malachi_meta::PolicyValue::Str(String::from_utf8_lossy(bytes).into_owned())
            }
        },
    }
}

pub fn policy_value_to_wire(value: &malachi_meta::PolicyValue) -> PolicyValue {
    match value {
        malachi_meta::PolicyValue::Null => PolicyValue::Null,
        malachi_meta::PolicyValue::Int(value) => PolicyValue::Integer(*value),
        malachi_meta::PolicyValue::Str(text) => PolicyValue::String(Bytes::from(text.clone())),
    }
}

pub fn policy_fields_to_wire(fields: &[malachi_meta::PolicyField]) -> Vec<PolicyField> {
    fields
        .iter()
        .map(|field| PolicyField {
            name: text_bytes(&field.name),
            value: policy_value_to_wire(&field.value),
        })
        .collect()
}

pub fn topic_policy_to_wire(view: &TopicPolicyView) -> TopicPolicyResponse {
    TopicPolicyResponse {
        topic: text_bytes(&view.topic),
        policy: view.policy.as_deref().and_then(text_bytes),
        resolution: match view.resolution {
            PolicyResolution::None => Resolution::None,
            PolicyResolution::Resolved => Resolution::Resolved,
            PolicyResolution::Unresolved => Resolution::Unresolved,
        },
        definition: view
            .definition
            .as_ref()
            .map(|definition| policy_fields_to_wire(&definition.to_fields())),
        effective: view.effective.iter().map(effective_to_wire).collect(),
    }
}

fn effective_to_wire(field: &EffectiveField) -> messages::EffectiveField {
    messages::EffectiveField {
        name: text_bytes(&field.name),
        value: policy_value_to_wire(&field.value),
        origin: match field.origin {
            FieldOrigin::Global => Origin::Global,
            FieldOrigin::Policy => Origin::Policy,
            FieldOrigin::UnresolvedBackstop => Origin::UnresolvedBackstop,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_the_log_type() {
        let wire = malachi_wire::Record {
            key: None,
            value: Bytes::from_static(b"v"),
            timestamp_ms: 7,
            headers: vec![Header { name: Bytes::from_static(b"a"), value: Bytes::new() }],
        };
        assert_eq!(record_to_wire(record_from_wire(wire.clone())), wire);
    }
}
