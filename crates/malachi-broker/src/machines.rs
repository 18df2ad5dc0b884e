//! The metadata and administrative machines as Raft-replicated state machines.
//!
//! Both wrap the pure machines of `malachi-meta`; the wrappers add nothing but the byte form of a
//! snapshot (canonical JSON: the states hold only ordered maps).

use malachi_consensus::StateMachine;
use malachi_meta::{
    AdminCommand, AdminError, AdminResponse, AdminState, MetaCommand, MetaError, MetaResponse,
    MetaState,
};

/// A vnode's metadata: topics, ranges, segments, groups, policies.
#[derive(Debug, Default)]
pub struct MetaMachine(pub MetaState);

impl StateMachine for MetaMachine {
    type Command = MetaCommand;
    type Response = Result<MetaResponse, MetaError>;

    fn apply(&mut self, command: MetaCommand) -> Self::Response {
        self.0.apply(command)
    }

    fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&self.0).expect("metadata state serializes")
    }

    fn restore(bytes: &[u8]) -> Result<MetaMachine, String> {
        serde_json::from_slice(bytes).map(MetaMachine).map_err(|error| error.to_string())
    }

    fn empty() -> MetaMachine {
        MetaMachine::default()
    }
}

/// The cluster-wide administrative state: users, ACL grants, lockouts.
#[derive(Debug, Default)]
pub struct AdminMachine(pub AdminState);

impl StateMachine for AdminMachine {
    type Command = AdminCommand;
    type Response = Result<AdminResponse, AdminError>;

    fn apply(&mut self, command: AdminCommand) -> Self::Response {
        self.0.apply(command)
    }

    fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&self.0).expect("admin state serializes")
    }

    fn restore(bytes: &[u8]) -> Result<AdminMachine, String> {
        let state: AdminState = serde_json::from_slice(bytes).map_err(|error| error.to_string())?;
        state.check_invariants().map_err(|violation| violation.detail)?;
        Ok(AdminMachine(state))
    }

    fn empty() -> AdminMachine {
        AdminMachine::default()
    }
}
