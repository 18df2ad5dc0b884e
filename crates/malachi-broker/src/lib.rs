//! The log API on one node: topics, ranges, produce, fetch with cursors, consumer groups,
//! split and merge, retention.

/// Every service, and the composition root, reads the shared plumbing through its private
/// `core` field: one `Deref` to [`node::Core`], written once here and invoked beside each type.
macro_rules! services_on_core {
    ($service:ty) => {
        impl std::ops::Deref for $service {
            type Target = crate::node::Core;

            fn deref(&self) -> &crate::node::Core {
                &self.core
            }
        }
    };
}

pub mod admin;
pub mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod coordinate;
pub mod coordinator;
pub mod cursor;
pub mod data;
pub mod describe;
pub mod enroll;
pub mod error;
pub mod fetch;
pub mod frontier;
pub mod gossip;
pub mod groups;
pub mod handover;
mod heads;
pub mod heal;
pub mod lag;
pub mod load;
pub mod machines;
pub mod maintenance;
pub mod members;
pub mod metrics;
pub mod node;
pub mod notify;
pub mod peer;
mod policies;
pub mod produce;
pub mod range_fetch;
mod remote;
pub mod replica;
pub mod scrape;
pub mod seats;
mod segments;
pub mod testing;
#[cfg(test)]
mod testkit;
pub mod topics;
pub mod vnodes;
