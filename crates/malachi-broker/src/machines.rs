//! The metadata, administrative and root machines as Raft-replicated state machines.
//!
//! One generic wrapper serves every pure machine of `malachi-meta`, so they cannot drift apart:
//! a snapshot is canonical JSON (the states hold only ordered maps), and a restored snapshot
//! must pass the machine's invariant check before it is used, whichever machine it is.

use malachi_consensus::StateMachine;
use malachi_meta::{
    AdminCommand, AdminError, AdminResponse, AdminState, InvariantViolation, MetaCommand,
    MetaError, MetaResponse, MetaState, RingCommand, RingError, RingResponse, RingState,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A pure machine of `malachi-meta`: commands in, responses out, invariants it can check.
pub trait PureMachine: Default + Serialize + DeserializeOwned + Send + Sync + 'static {
    type Command: Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static;
    type Response: Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static;

    fn apply(&mut self, command: Self::Command) -> Self::Response;
    fn check_invariants(&self) -> Result<(), InvariantViolation>;
}

impl PureMachine for MetaState {
    type Command = MetaCommand;
    type Response = Result<MetaResponse, MetaError>;

    fn apply(&mut self, command: MetaCommand) -> Self::Response {
        MetaState::apply(self, command)
    }

    fn check_invariants(&self) -> Result<(), InvariantViolation> {
        MetaState::check_invariants(self)
    }
}

impl PureMachine for AdminState {
    type Command = AdminCommand;
    type Response = Result<AdminResponse, AdminError>;

    fn apply(&mut self, command: AdminCommand) -> Self::Response {
        AdminState::apply(self, command)
    }

    fn check_invariants(&self) -> Result<(), InvariantViolation> {
        AdminState::check_invariants(self)
    }
}

impl PureMachine for RingState {
    type Command = RingCommand;
    type Response = Result<RingResponse, RingError>;

    fn apply(&mut self, command: RingCommand) -> Self::Response {
        RingState::apply(self, command)
    }

    fn check_invariants(&self) -> Result<(), InvariantViolation> {
        RingState::check_invariants(self)
    }
}

/// A pure machine replicated by Raft.
#[derive(Debug, Default)]
pub struct Replicated<S>(pub S);

/// A vnode's metadata: topics, ranges, segments, groups, policies.
pub type MetaMachine = Replicated<MetaState>;
/// The cluster-wide administrative state: users, ACL grants, lockouts, brokers, policies.
pub type AdminMachine = Replicated<AdminState>;
/// The root group's state: the ring of vnodes.
pub type RootMachine = Replicated<RingState>;

impl<S: PureMachine> StateMachine for Replicated<S> {
    type Command = S::Command;
    type Response = S::Response;

    fn apply(&mut self, command: S::Command) -> S::Response {
        self.0.apply(command)
    }

    fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&self.0).expect("machine states serialize: string and integer keys")
    }

    fn restore(bytes: &[u8]) -> Result<Replicated<S>, String> {
        let state: S = serde_json::from_slice(bytes).map_err(|error| error.to_string())?;
        state.check_invariants().map_err(|violation| violation.detail)?;
        Ok(Replicated(state))
    }

    fn empty() -> Replicated<S> {
        Replicated(S::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot that decodes but breaks an invariant is refused by both machines alike.
    #[test]
    fn both_machines_refuse_a_snapshot_that_breaks_an_invariant() {
        let mut meta = MetaState::default();
        meta.apply(MetaCommand::CreateTopic(malachi_meta::CreateTopic {
            name: "orders".into(),
            now_ms: 1,
            initial_ranges: Some(2),
            segment_roll: Default::default(),
            replicas: vec![1],
            creator: None,
            quota: Default::default(),
        }))
        .unwrap();
        let good = Replicated(meta).snapshot();
        assert!(MetaMachine::restore(&good).is_ok());
        let mut broken: serde_json::Value = serde_json::from_slice(&good).unwrap();
        // Drop the name index entry: the topic can no longer be found by its name.
        broken["topic_ids_by_name"] = serde_json::json!({});
        let broken = serde_json::to_vec(&broken).unwrap();
        assert!(MetaMachine::restore(&broken).unwrap_err().contains("name index"));

        let admin = Replicated(AdminState::default()).snapshot();
        assert!(AdminMachine::restore(&admin).is_ok());
        let mut broken: serde_json::Value = serde_json::from_slice(&admin).unwrap();
        broken["acls"] = serde_json::json!({ "nobody": [] });
        let broken = serde_json::to_vec(&broken).unwrap();
        assert!(AdminMachine::restore(&broken).is_err());
    }
}
