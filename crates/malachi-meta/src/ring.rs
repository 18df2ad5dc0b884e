//! The ring of vnodes: the topic-name hash space `[0, 2^64)` cut into `count` equal arcs, one
//! per vnode, each vnode a Raft group of its own holding the topics whose names hash into its
//! arc. Does no I/O.
//!
//! The ring is fixed when the cluster is created (`MALACHI_LOG_VNODES`): a topic never moves
//! between vnodes, so its vnode is a pure function of its name and the count. Vnode `v` (1-based,
//! also its Raft group id) hands out topic and segment ids from its own block, `(v - 1) << 48`
//! upwards, so ids are unique across the cluster without coordination, and any id names its
//! vnode. Vnode 1's block starts at 0: a broker that ran as a single vnode before the ring existed
//! keeps its ids.

use serde::{Deserialize, Serialize};

use crate::invariants::InvariantViolation;

/// The most vnodes a ring may have: each is a Raft group on every broker.
pub const VNODES_MAX: u32 = 256;
/// Bits of an id below its vnode's block: 2^48 topics and 2^48 segments per vnode.
pub const ID_BLOCK_BITS: u32 = 48;

/// The point a topic name hashes to on the ring. Pinned by golden values: changing it would
/// move every topic to another vnode.
pub fn name_point(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

/// One vnode's arc of the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VnodeArc {
    /// 1-based; also the vnode's Raft group id.
    pub vnode_id: u32,
    pub start: u64,
    pub end_inclusive: u64,
}

impl VnodeArc {
    /// The arc of vnode `vnode_id` on a ring of `count` (both checked by [`check_ring`]).
    pub fn of(vnode_id: u32, count: u32) -> VnodeArc {
        assert!(
            check_ring(count).is_ok() && (1..=count).contains(&vnode_id),
            "vnode {vnode_id}/{count}"
        );
        let width = (1u128 << 64) / u128::from(count);
        let start = width * u128::from(vnode_id - 1);
        let end = if vnode_id == count { u128::from(u64::MAX) } else { start + width - 1 };
        VnodeArc { vnode_id, start: start as u64, end_inclusive: end as u64 }
    }

    pub fn owns_point(&self, point: u64) -> bool {
        (self.start..=self.end_inclusive).contains(&point)
    }

    pub fn owns_name(&self, name: &str) -> bool {
        self.owns_point(name_point(name))
    }

    /// The first id of this vnode's block (ids handed out start one above it).
    pub fn id_base(&self) -> u64 {
        u64::from(self.vnode_id - 1) << ID_BLOCK_BITS
    }

    /// Whether `id` (a topic or segment id) was handed out by this vnode.
    pub fn owns_id(&self, id: u64) -> bool {
        vnode_of_id(id) == self.vnode_id
    }
}

/// Checks a ring size.
pub fn check_ring(count: u32) -> Result<(), String> {
    if (1..=VNODES_MAX).contains(&count) {
        Ok(())
    } else {
        Err(format!("a ring has 1 to {VNODES_MAX} vnodes, not {count}"))
    }
}

/// The vnode holding topic `name` on a ring of `count`.
pub fn vnode_of_name(name: &str, count: u32) -> u32 {
    let width = (1u128 << 64) / u128::from(count);
    let index = (u128::from(name_point(name)) / width).min(u128::from(count - 1));
    index as u32 + 1
}

/// The vnode that handed out topic or segment `id`.
pub fn vnode_of_id(id: u64) -> u32 {
    (id >> ID_BLOCK_BITS) as u32 + 1
}

/// The root group's machine: the ring itself, durable and agreed on by the cluster. It holds
/// the vnode count, fixed once (`MALACHI_LOG_VNODES` of the broker that created the cluster, or
/// 1 for a broker that ran a single vnode before the ring existed); the arcs follow from it.
/// Each vnode's voters are its own Raft group's membership, kept by the seats loop.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingState {
    vnodes: Option<u32>,
    /// Commands accepted so far.
    version: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RingCommand {
    /// Fixes the ring at `vnodes` vnodes; again with the same count, a no-op.
    Define { vnodes: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RingResponse {
    /// `already`: the ring had this count before.
    Defined { already: bool },
}

/// Why the root machine refused a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RingError {
    #[error("{0}")]
    InvalidCount(String),
    #[error("the ring has {held} vnodes; it cannot become {asked}")]
    AlreadyDefined { held: u32, asked: u32 },
}

impl RingError {
    /// The reason string (ours: the ring never reaches a client).
    pub fn reason(&self) -> String {
        match self {
            RingError::InvalidCount(_) => "invalid_ring".into(),
            RingError::AlreadyDefined { .. } => "ring_defined".into(),
        }
    }
}

impl RingState {
    /// The vnode count, once defined.
    pub fn vnodes(&self) -> Option<u32> {
        self.vnodes
    }

    /// The arcs of the defined ring, in vnode order (none before it is defined).
    pub fn arcs(&self) -> Vec<VnodeArc> {
        let count = self.vnodes.unwrap_or(0);
        (1..=count).map(|vnode_id| VnodeArc::of(vnode_id, count)).collect()
    }

    pub fn apply(&mut self, command: RingCommand) -> Result<RingResponse, RingError> {
        let RingCommand::Define { vnodes } = command;
        check_ring(vnodes).map_err(RingError::InvalidCount)?;
        let response = match self.vnodes {
            Some(held) if held == vnodes => RingResponse::Defined { already: true },
            Some(held) => return Err(RingError::AlreadyDefined { held, asked: vnodes }),
            None => {
                self.vnodes = Some(vnodes);
                RingResponse::Defined { already: false }
            }
        };
        self.version += 1;
        Ok(response)
    }

    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        match self.vnodes {
            Some(count) => check_ring(count).map_err(|detail| InvariantViolation { detail }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_hash_to_pinned_points() {
        // Golden values: xxh3-64 of the name's bytes (checked with Python's xxhash package).
        let cases = [("orders", 0xa88c_cdc9_fa49_74fb_u64), ("a", 0xe6c6_32b6_1e96_4e1f)];
        for (name, point) in cases {
            assert_eq!(name_point(name), point, "{name}: {:#x}", name_point(name));
        }
    }

    #[test]
    fn arcs_tile_the_ring_and_agree_with_the_lookup() {
        for count in [1, 2, 3, 7, 8, 64, VNODES_MAX] {
            let arcs: Vec<VnodeArc> = (1..=count).map(|vnode| VnodeArc::of(vnode, count)).collect();
            assert_eq!(arcs[0].start, 0);
            assert_eq!(arcs.last().unwrap().end_inclusive, u64::MAX);
            for pair in arcs.windows(2) {
                assert_eq!(pair[0].end_inclusive + 1, pair[1].start, "{count}");
            }
            for name in ["orders", "a", "payments.eu-1", "x".repeat(249).as_str()] {
                let vnode = vnode_of_name(name, count);
                assert!(arcs[vnode as usize - 1].owns_name(name), "{name} on {count}");
                assert_eq!(arcs.iter().filter(|arc| arc.owns_name(name)).count(), 1);
            }
            for arc in &arcs {
                for id in [arc.id_base() + 1, arc.id_base() + (1 << ID_BLOCK_BITS) - 1] {
                    assert!(arc.owns_id(id) && vnode_of_id(id) == arc.vnode_id, "{id:#x}");
                }
            }
        }
        // Vnode 1's ids are the ids a single-vnode broker handed out before the ring.
        assert_eq!(VnodeArc::of(1, 8).id_base(), 0);
        assert_eq!(VnodeArc::of(1, 1), VnodeArc { vnode_id: 1, start: 0, end_inclusive: u64::MAX });
        assert!(check_ring(0).is_err() && check_ring(VNODES_MAX + 1).is_err());
    }

    #[test]
    fn the_ring_is_defined_once() {
        let mut ring = RingState::default();
        assert_eq!(ring.vnodes(), None);
        assert!(ring.arcs().is_empty());
        let define = |vnodes| RingCommand::Define { vnodes };
        let cases: Vec<(u32, Result<RingResponse, &str>)> = vec![
            (0, Err("invalid_ring")),
            (VNODES_MAX + 1, Err("invalid_ring")),
            (8, Ok(RingResponse::Defined { already: false })),
            (8, Ok(RingResponse::Defined { already: true })),
            (4, Err("ring_defined")),
        ];
        for (vnodes, expected) in cases {
            let before = ring.clone();
            let outcome = ring.apply(define(vnodes));
            match expected {
                Ok(response) => assert_eq!(outcome, Ok(response), "{vnodes}"),
                Err(reason) => {
                    assert_eq!(outcome.map_err(|error| error.reason()), Err(reason.into()));
                    assert_eq!(ring, before, "a refusal changes nothing");
                }
            }
            assert!(ring.check_invariants().is_ok());
        }
        assert_eq!(ring.vnodes(), Some(8));
        assert_eq!(ring.arcs(), (1..=8).map(|vnode| VnodeArc::of(vnode, 8)).collect::<Vec<_>>());
    }
}
