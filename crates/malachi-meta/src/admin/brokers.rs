//! The cluster's brokers in [`AdminState`]: each broker's node id and the addresses peers and
//! clients use for it, registered when it joins and again when it restarts somewhere else. The
//! inter-node transport's address book is read from here, so a restarted broker finds its peers
//! from its own copy of the state. Does no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{AdminResponse, AdminState};
use crate::error::AdminError;

/// Brokers one cluster may hold.
pub const BROKERS_MAX: usize = 1_024;
/// A `host:port` of a broker: a DNS name is at most 253 bytes, plus the port.
pub const BROKER_ADDRESS_BYTES_MAX: usize = 261;
/// Placement attributes of one broker, each name and value at most this long.
const ATTRIBUTES_MAX: usize = 16;
const ATTRIBUTE_BYTES_MAX: usize = 255;

/// One broker of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRecord {
    pub node_id: u64,
    /// Where peers reach its inter-node port (`MALACHI_ADVERTISE_HOST:MALACHI_CLUSTER_PORT`).
    pub cluster_address: String,
    /// Where clients reach its client port.
    pub client_address: String,
    /// Its placement attributes (`MALACHI_LOG_ATTRIBUTES`).
    pub attributes: BTreeMap<String, String>,
    /// Where its SWIM datagrams go (`MALACHI_ADVERTISE_HOST:MALACHI_CLUSTER_GOSSIP_PORT`):
    /// every broker announces itself to the registered brokers' gossip addresses. Empty in
    /// records written before membership existed, until the broker restarts.
    #[serde(default)]
    pub gossip_address: String,
}

impl AdminState {
    /// The cluster's brokers in node id order.
    pub fn brokers(&self) -> impl Iterator<Item = &BrokerRecord> {
        self.brokers.values()
    }

    pub fn broker(&self, node_id: u64) -> Option<&BrokerRecord> {
        self.brokers.get(&node_id)
    }

    /// Whether `node_id` is being decommissioned.
    pub fn broker_leaving(&self, node_id: u64) -> bool {
        self.leaving.contains(&node_id)
    }

    pub(super) fn set_broker_leaving(
        &mut self,
        node_id: u64,
        leaving: bool,
    ) -> Result<AdminResponse, AdminError> {
        if !self.brokers.contains_key(&node_id) {
            return Err(AdminError::InvalidBroker(format!("no broker {node_id} is registered")));
        }
        let changed =
            if leaving { self.leaving.insert(node_id) } else { self.leaving.remove(&node_id) };
        Ok(AdminResponse::BrokerLeavingSet { changed })
    }

    pub(super) fn remove_broker(&mut self, node_id: u64) -> Result<AdminResponse, AdminError> {
        if !self.leaving.contains(&node_id) {
            return Err(AdminError::InvalidBroker(format!(
                "broker {node_id} is not marked leaving; decommission it first"
            )));
        }
        self.leaving.remove(&node_id);
        self.brokers.remove(&node_id);
        Ok(AdminResponse::BrokerRemoved)
    }

    pub(super) fn register_broker(
        &mut self,
        broker: BrokerRecord,
    ) -> Result<AdminResponse, AdminError> {
        validate(&broker)?;
        if !self.brokers.contains_key(&broker.node_id) && self.brokers.len() >= BROKERS_MAX {
            return Err(AdminError::InvalidBroker(
                "the cluster holds the most brokers it may".into(),
            ));
        }
        let previous = self.brokers.insert(broker.node_id, broker.clone());
        Ok(AdminResponse::BrokerRegistered { changed: previous.as_ref() != Some(&broker) })
    }
}

fn validate(broker: &BrokerRecord) -> Result<(), AdminError> {
    let address_ok = |address: &str| {
        !address.is_empty()
            && address.len() <= BROKER_ADDRESS_BYTES_MAX
            && !address.chars().any(char::is_control)
    };
    if broker.node_id == 0 {
        return Err(AdminError::InvalidBroker("node id 0 is reserved".into()));
    }
    let gossip_ok = broker.gossip_address.is_empty() || address_ok(&broker.gossip_address);
    if !address_ok(&broker.cluster_address) || !address_ok(&broker.client_address) || !gossip_ok {
        return Err(AdminError::InvalidBroker("an address is empty, too long or not text".into()));
    }
    let attribute_ok = |text: &String| !text.is_empty() && text.len() <= ATTRIBUTE_BYTES_MAX;
    if broker.attributes.len() > ATTRIBUTES_MAX
        || !broker.attributes.iter().all(|(name, value)| attribute_ok(name) && attribute_ok(value))
    {
        return Err(AdminError::InvalidBroker(
            "too many attributes, or one empty or too long".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AdminCommand;

    fn broker(node_id: u64, cluster_address: &str) -> BrokerRecord {
        BrokerRecord {
            node_id,
            cluster_address: cluster_address.into(),
            client_address: "127.0.0.1:4040".into(),
            attributes: BTreeMap::from([("rack".into(), "a".into())]),
            gossip_address: "127.0.0.1:45892".into(),
        }
    }

    #[test]
    fn registrations_are_validated_and_replace_by_node_id() {
        let mut state = AdminState::default();
        let register =
            |state: &mut AdminState, broker| state.apply(AdminCommand::RegisterBroker { broker });
        assert_eq!(
            register(&mut state, broker(1, "10.0.0.1:4042")),
            Ok(AdminResponse::BrokerRegistered { changed: true })
        );
        assert_eq!(
            register(&mut state, broker(1, "10.0.0.1:4042")),
            Ok(AdminResponse::BrokerRegistered { changed: false })
        );
        register(&mut state, broker(1, "10.0.0.9:4042")).unwrap();
        assert_eq!(state.broker(1).unwrap().cluster_address, "10.0.0.9:4042");
        let long = "h".repeat(BROKER_ADDRESS_BYTES_MAX + 1);
        let mut many_attributes = broker(3, "x:1");
        many_attributes.attributes =
            (0..=ATTRIBUTES_MAX).map(|i| (format!("a{i}"), "v".to_string())).collect();
        let mut bad_gossip = broker(4, "x:1");
        bad_gossip.gossip_address = "a\tb:1".into();
        let mut no_gossip = broker(5, "x:1");
        no_gossip.gossip_address.clear();
        let refused = [
            broker(0, "10.0.0.1:4042"),
            broker(2, ""),
            broker(2, &long),
            broker(2, "a\nb:1"),
            many_attributes,
            bad_gossip,
        ];
        let version = state.version();
        for bad in refused {
            let error = register(&mut state, bad.clone()).unwrap_err();
            assert_eq!(error.reason(), "invalid_broker", "{bad:?}");
        }
        assert_eq!(state.version(), version, "refused registrations change nothing");
        assert_eq!(state.brokers().count(), 1);
        // A record from before membership has no gossip address, and is valid.
        register(&mut state, no_gossip).unwrap();
        assert_eq!(state.brokers().count(), 2);
    }

    /// A broker leaves in two steps: marked leaving, then removed; never removed unmarked.
    #[test]
    fn a_broker_is_marked_leaving_before_it_is_removed() {
        let mut state = AdminState::default();
        state.register_broker(broker(1, "h:1")).unwrap();
        state.register_broker(broker(2, "h:2")).unwrap();
        let leave = |node_id, leaving| AdminCommand::SetBrokerLeaving { node_id, leaving };
        let remove = |node_id| AdminCommand::RemoveBroker { node_id };
        let steps = [
            (remove(2), "invalid_broker"),
            (leave(3, true), "invalid_broker"),
            (leave(2, true), "ok"),
            (leave(2, false), "ok"),
            (remove(2), "invalid_broker"),
            (leave(2, true), "ok"),
            (remove(2), "ok"),
            (remove(2), "invalid_broker"),
        ];
        for (at, (command, expected)) in steps.into_iter().enumerate() {
            let outcome = state.apply(command);
            let got = outcome.as_ref().map_or_else(|error| error.reason_text(), |_| "ok".into());
            assert_eq!(got, expected, "step {at}");
            state.check_invariants().unwrap();
        }
        assert!(state.broker(2).is_none() && !state.broker_leaving(2));
        assert_eq!(state.brokers().count(), 1);
    }

    #[test]
    fn the_broker_count_is_bounded() {
        let mut state = AdminState::default();
        for node_id in 1..=BROKERS_MAX as u64 {
            state.register_broker(broker(node_id, "h:1")).unwrap();
        }
        let refused = state.register_broker(broker(BROKERS_MAX as u64 + 1, "h:1"));
        assert_eq!(refused.unwrap_err().reason(), "invalid_broker");
        // A known broker may still move.
        state.register_broker(broker(1, "h:2")).unwrap();
    }
}
