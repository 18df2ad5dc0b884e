//! The follower side of a segment's replication, sans-IO: who may ship to a copy, where a
//! shipped batch goes in it, and how far readers of the copy may see.
//!
//! A primary ships spans of its head ([`Primary`](crate::replication::Primary) decides which);
//! calls are handled concurrently, so a span may arrive before the ones it follows, or again
//! after a lost answer. The driver (the broker's `replica.rs`) asks [`place`] where each batch
//! goes against the copy's staged end, stages what it says, and answers the copy's durable end;
//! a batch that finds a gap waits for the batches before it, then is refused with the copy's
//! end, from which the primary ships again. [`Copy`] keeps what the primary last said is
//! acknowledged, which is all a reader of a follower copy may see.

/// A segment's replicas as one broker sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// One copy, here: no replication.
    Alone,
    /// This broker is the primary; these are the followers.
    Primary { followers: Vec<u64> },
    /// This broker holds a follower copy.
    Follower { primary: u64 },
    /// The copies are all elsewhere, the primary first.
    Outside { replicas: Vec<u64> },
}

impl Role {
    /// `own`'s role among `replicas` (the primary first).
    pub fn of(replicas: &[u64], own: u64) -> Role {
        match replicas.iter().position(|&replica| replica == own) {
            Some(_) if replicas.len() == 1 => Role::Alone,
            Some(0) => Role::Primary { followers: replicas[1..].to_vec() },
            Some(_) => Role::Follower { primary: replicas[0] },
            None => Role::Outside { replicas: replicas.to_vec() },
        }
    }
}

/// Why a copy refuses a shipped batch before looking at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// This broker holds the primary's copy (or the only one): nobody ships to it.
    PrimaryHere,
    /// The sender is not the segment's primary, or this broker holds no copy.
    NotFromPrimary,
}

/// Whether a batch shipped by `source` may go into this broker's copy, given its `role`: only
/// a follower takes batches, and only from its primary.
pub fn admit(role: &Role, source: u64) -> Result<(), Refusal> {
    match role {
        Role::Follower { primary } if *primary == source => Ok(()),
        Role::Primary { .. } | Role::Alone => Err(Refusal::PrimaryHere),
        Role::Follower { .. } | Role::Outside { .. } => Err(Refusal::NotFromPrimary),
    }
}

/// Where a shipped batch goes in a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// It starts past the copy's end: the batches before it have not arrived.
    Gap,
    /// The copy holds all of it already (shipped again after a refusal or a lost answer): the
    /// same records, since only the primary writes them.
    Held,
    /// Stage the batch's records from `skip` on: the copy holds the ones before.
    Stage { skip: usize },
}

/// Where a batch of `records` shipped to start at `start` goes in a copy staged to
/// `staged_end`.
pub fn place(staged_end: u64, start: u64, records: usize) -> Placement {
    let end = start + records as u64;
    let placement = if start > staged_end {
        Placement::Gap
    } else if end <= staged_end {
        Placement::Held
    } else {
        Placement::Stage { skip: (staged_end - start) as usize }
    };
    if let Placement::Stage { skip } = placement {
        // What is staged continues the copy exactly where it ends, and is not empty.
        assert_eq!(start + skip as u64, staged_end, "a batch is staged where the copy ends");
        assert!(skip < records, "a staged batch adds at least one record");
    }
    placement
}

/// A follower copy's view of its head: how far readers of it may see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copy {
    visible_end: u64,
}

impl Copy {
    /// The copy answered a span durable to `durable`, whose primary said records below
    /// `acked_end` are acknowledged: readers may see up to the lower of the two. Never moves
    /// back, as an acknowledgement cannot be taken back.
    pub fn acked(&mut self, acked_end: u64, durable: u64) {
        let before = self.visible_end;
        self.visible_end = self.visible_end.max(acked_end.min(durable));
        assert!(self.visible_end >= before, "what readers see never moves back");
    }

    /// Where readers of the copy stop.
    pub fn visible_end(&self) -> u64 {
        self.visible_end
    }
}

#[cfg(test)]
mod tests;
