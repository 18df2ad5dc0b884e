//! Section 3.5: storage policies, keys 17–21 (all admin-only). Field names are carried as sent:
//! decoders accept names they do not know, the server refuses them by name.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError};
use crate::primitive::{Reader, Wire, Writer};
use crate::shapes::{PolicyField, PolicyValue};

/// Key 17: defines or replaces a policy. An omitted field inherits the global value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefinePolicyRequest {
    pub name: Option<Bytes>,
    /// `list16<policy field>`.
    pub fields: Vec<PolicyField>,
}

/// Key 18. Deleting an undefined name is ok.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeletePolicyRequest {
    pub name: Option<Bytes>,
    /// Delete even while topics are bound to it. A byte other than 0 or 1 is malformed.
    pub force: bool,
}

/// Key 19's ok answer, sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPoliciesResponse {
    /// `list32` (the outer count is 32-bit, the field lists 16-bit).
    pub policies: Vec<NamedPolicy>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamedPolicy {
    pub name: Option<Bytes>,
    pub fields: Vec<PolicyField>,
}

/// Key 20.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BindTopicPolicyRequest {
    pub topic: Option<Bytes>,
    /// `None` detaches the topic from its policy.
    pub name: Option<Bytes>,
}

/// Key 21.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GetTopicPolicyRequest {
    pub topic: Option<Bytes>,
}

/// Key 21's ok answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicPolicyResponse {
    pub topic: Option<Bytes>,
    /// The bound policy's name; `None` when unbound.
    pub policy: Option<Bytes>,
    pub resolution: Resolution,
    /// The bound policy's fields; on the wire `has_definition:u8` then the fields if it is 1.
    pub definition: Option<Vec<PolicyField>>,
    /// Every rule's effective value and where it came from.
    pub effective: Vec<EffectiveField>,
}

/// How a topic's binding resolved (`resolution:u8`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// 0: no policy bound.
    #[default]
    None,
    /// 1: bound to a defined policy.
    Resolved,
    /// 2: bound to a name that is not defined.
    Unresolved,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectiveField {
    pub name: Option<Bytes>,
    pub value: PolicyValue,
    pub origin: Origin,
}

/// Where an effective value came from (`origin:u8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// 0.
    Global,
    /// 1.
    Policy,
    /// 2: the backstop applied while the bound policy is undefined.
    UnresolvedBackstop,
}

impl Wire for DefinePolicyRequest {
    const WIRE_BYTES_MIN: usize = 1 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.name.as_deref())?;
        writer.list16(&self.fields)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DefinePolicyRequest { name: reader.str()?, fields: reader.list16()? })
    }
}

impl Wire for DeletePolicyRequest {
    const WIRE_BYTES_MIN: usize = 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.name.as_deref())?;
        writer.bool(self.force);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DeletePolicyRequest { name: reader.str()?, force: reader.bool()? })
    }
}

impl Wire for ListPoliciesResponse {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.list32(&self.policies)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ListPoliciesResponse { policies: reader.list32()? })
    }
}

impl Wire for NamedPolicy {
    const WIRE_BYTES_MIN: usize = 1 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.name.as_deref())?;
        writer.list16(&self.fields)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(NamedPolicy { name: reader.str()?, fields: reader.list16()? })
    }
}

impl Wire for BindTopicPolicyRequest {
    const WIRE_BYTES_MIN: usize = 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.name.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(BindTopicPolicyRequest { topic: reader.str()?, name: reader.str()? })
    }
}

impl Wire for GetTopicPolicyRequest {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(GetTopicPolicyRequest { topic: reader.str()? })
    }
}

impl Wire for TopicPolicyResponse {
    /// Two absent strs, resolution, has_definition 0, an empty effective list.
    const WIRE_BYTES_MIN: usize = 2 + 1 + 1 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.policy.as_deref())?;
        writer.u8(self.resolution.as_u8());
        writer.bool(self.definition.is_some());
        if let Some(fields) = &self.definition {
            writer.list16(fields)?;
        }
        writer.list16(&self.effective)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        let topic = reader.str()?;
        let policy = reader.str()?;
        let resolution = Resolution::from_u8(reader.u8()?)?;
        let definition = match reader.bool()? {
            true => Some(reader.list16()?),
            false => None,
        };
        let effective = reader.list16()?;
        Ok(TopicPolicyResponse { topic, policy, resolution, definition, effective })
    }
}

impl Resolution {
    fn from_u8(tag: u8) -> Result<Resolution, DecodeError> {
        match tag {
            0 => Ok(Resolution::None),
            1 => Ok(Resolution::Resolved),
            2 => Ok(Resolution::Unresolved),
            tag => Err(DecodeError::UnknownTag { field: "resolution", tag }),
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Resolution::None => 0,
            Resolution::Resolved => 1,
            Resolution::Unresolved => 2,
        }
    }
}

impl Wire for EffectiveField {
    const WIRE_BYTES_MIN: usize = 1 + 1 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.name.as_deref())?;
        writer.item(&self.value)?;
        writer.u8(self.origin.as_u8());
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(EffectiveField {
            name: reader.str()?,
            value: reader.item()?,
            origin: Origin::from_u8(reader.u8()?)?,
        })
    }
}

impl Origin {
    fn from_u8(tag: u8) -> Result<Origin, DecodeError> {
        match tag {
            0 => Ok(Origin::Global),
            1 => Ok(Origin::Policy),
            2 => Ok(Origin::UnresolvedBackstop),
            tag => Err(DecodeError::UnknownTag { field: "origin", tag }),
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Origin::Global => 0,
            Origin::Policy => 1,
            Origin::UnresolvedBackstop => 2,
        }
    }
}
