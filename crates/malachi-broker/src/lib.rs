//! The log API on one node: topics, ranges, produce, fetch with cursors, consumer groups,
//! split and merge, retention.

pub mod auth;
pub mod config;
pub mod cursor;
pub mod data;
pub mod frontier;
pub mod load;
pub mod notify;
#[cfg(test)]
mod testkit;
