//! Section 3.5: storage policies, keys 17–21 (all admin-only). Field names are carried as sent:
//! decoders accept names they do not know, the server refuses them by name.

use bytes::Bytes;

use crate::layout::{Bool, Flagged, Item, List16, List32, Str, wire_enum, wire_struct};
use crate::shapes::{PolicyField, PolicyValue};

wire_struct! {
    /// Key 17: defines or replaces a policy. An omitted field inherits the global value.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DefinePolicyRequest {
        pub name: Option<Bytes> = Str,
        /// `list16<policy field>`.
        pub fields: Vec<PolicyField> = List16,
    }
}

wire_struct! {
    /// Key 18. Deleting an undefined name is ok.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DeletePolicyRequest {
        pub name: Option<Bytes> = Str,
        /// Delete even while topics are bound to it. A byte other than 0 or 1 is malformed.
        pub force: bool = Bool,
    }
}

wire_struct! {
    /// Key 19's ok answer, sorted by name.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ListPoliciesResponse {
        /// `list32` (the outer count is 32-bit, the field lists 16-bit).
        pub policies: Vec<NamedPolicy> = List32,
    }
}

wire_struct! {
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct NamedPolicy {
        pub name: Option<Bytes> = Str,
        pub fields: Vec<PolicyField> = List16,
    }
}

wire_struct! {
    /// Key 20.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct BindTopicPolicyRequest {
        pub topic: Option<Bytes> = Str,
        /// `None` detaches the topic from its policy.
        pub name: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 21.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct GetTopicPolicyRequest {
        pub topic: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 21's ok answer.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct TopicPolicyResponse {
        pub topic: Option<Bytes> = Str,
        /// The bound policy's name; `None` when unbound.
        pub policy: Option<Bytes> = Str,
        pub resolution: Resolution = Item,
        /// The bound policy's fields; on the wire `has_definition:u8` then the fields if it is 1.
        pub definition: Option<Vec<PolicyField>> = Flagged<List16>,
        /// Every rule's effective value and where it came from.
        pub effective: Vec<EffectiveField> = List16,
    }
}

wire_enum! {
    /// How a topic's binding resolved (`resolution:u8`).
    #[derive(Default)]
    pub enum Resolution as "resolution" {
        /// No policy bound.
        #[default]
        None = 0,
        /// Bound to a defined policy.
        Resolved = 1,
        /// Bound to a name that is not defined.
        Unresolved = 2,
    }
}

wire_struct! {
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct EffectiveField {
        pub name: Option<Bytes> = Str,
        pub value: PolicyValue = Item,
        pub origin: Origin = Item,
    }
}

wire_enum! {
    /// Where an effective value came from (`origin:u8`).
    pub enum Origin as "origin" {
        Global = 0,
        Policy = 1,
        /// The backstop applied while the bound policy is undefined.
        UnresolvedBackstop = 2,
    }
}
