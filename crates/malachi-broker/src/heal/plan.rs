//! What healing does to one sealed segment, decided without I/O: the healer (`heal.rs`) gathers
//! the segment's replicas and each replica's broker's health, asks [`plan`], and carries out
//! the steps in order (settle each copy, then record the settled ones; move replicas off lost
//! brokers; grow a short replica set). Every plan is checked against the rules it must keep
//! before it is returned.

/// A sealed segment as healing sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Its replicas, the primary first.
    pub replicas: Vec<u64>,
    /// The replicas whose copy is settled.
    pub settled_on: Vec<u64>,
    /// Replicas on their way out: a move to another broker is under way.
    pub moving_off: Vec<u64>,
    /// Fewer replicas stay than the segment should have (placed while brokers were down).
    pub short: bool,
}

/// A replica's broker, as membership sees it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    Alive,
    /// Dead, but not for long enough to give its copies up.
    Dead,
    /// Dead longer than `MALACHI_REPLICA_REPLACE_AFTER_MS`: its copies are lost to the cluster.
    Lost,
}

/// One thing to do for the segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Check `replica`'s copy, rebuilding it from `sources` (settled copies first) if it is
    /// not sealed at the recorded length and intact.
    Settle { replica: u64, sources: Vec<u64> },
    /// Move the replica off `lost` to a broker placement chooses.
    Replace { lost: u64 },
    /// Add one replica on a broker placement chooses.
    Grow,
}

impl Facts {
    /// The replicas that stay once the moves under way finish.
    pub fn staying(&self) -> impl Iterator<Item = u64> + '_ {
        self.replicas.iter().copied().filter(|node| !self.moving_off.contains(node))
    }

    /// Whether healing has anything to do for the segment: a replicated segment with a copy
    /// not settled or a replica on a lost broker, or a replica set short of the factor.
    pub fn needs_healing(&self, health: impl Fn(u64) -> Health) -> bool {
        let whole = self.replicas.iter().all(|replica| self.settled_on.contains(replica));
        let lost = self.staying().any(|replica| health(replica) == Health::Lost);
        (self.replicas.len() > 1 && (!whole || lost)) || self.short
    }

    /// Where `replica` may rebuild its copy from: the settled copies first, then the other
    /// copies (a copy not settled, even unsealed, holds the records a seal covers when it is
    /// long enough: one primary wrote every copy, and a rebuild is checked against the
    /// recorded length and bytes). The copies not settled matter when every settled one is
    /// damaged or gone: two replicas, one sealed and then damaged, the other never sealed.
    pub fn sources_for(&self, replica: u64) -> Vec<u64> {
        let unsettled = self.replicas.iter().filter(|node| !self.settled_on.contains(node));
        self.settled_on.iter().chain(unsettled).copied().filter(|&node| node != replica).collect()
    }
}

/// The steps that heal the segment now: settle every copy not settled on a broker that is not
/// dead; move every replica off a lost broker (settled or not) unless a move is under way;
/// then, with no move under way and a settled copy to copy from, grow a short set by one
/// (placement then sees the whole set it adds to).
pub(crate) fn plan(facts: &Facts, health: impl Fn(u64) -> Health) -> Vec<Step> {
    let mut steps = Vec::new();
    for &replica in &facts.replicas {
        let moving = facts.moving_off.contains(&replica);
        match health(replica) {
            Health::Lost if !moving => steps.push(Step::Replace { lost: replica }),
            Health::Lost | Health::Dead => {}
            Health::Alive if facts.settled_on.contains(&replica) => {}
            Health::Alive => {
                steps.push(Step::Settle { replica, sources: facts.sources_for(replica) });
            }
        }
    }
    if facts.short && facts.moving_off.is_empty() && !facts.settled_on.is_empty() {
        steps.push(Step::Grow);
    }
    check(facts, &health, &steps);
    steps
}

/// The rules every plan keeps.
fn check(facts: &Facts, health: &impl Fn(u64) -> Health, steps: &[Step]) {
    let mut touched = Vec::new();
    for step in steps {
        match step {
            Step::Settle { replica, sources } => {
                assert!(facts.replicas.contains(replica), "only a replica is settled");
                assert_eq!(health(*replica), Health::Alive, "a dead broker is not asked to settle");
                assert!(!sources.contains(replica), "a copy is not rebuilt from itself");
                assert!(sources.iter().all(|s| facts.replicas.contains(s)), "sources are copies");
                touched.push(*replica);
            }
            Step::Replace { lost } => {
                assert_eq!(health(*lost), Health::Lost, "only a lost broker's replica moves");
                assert!(!facts.moving_off.contains(lost), "one move per replica at a time");
                touched.push(*lost);
            }
            Step::Grow => {
                assert!(facts.short && facts.moving_off.is_empty(), "growth only when short");
                assert!(!facts.settled_on.is_empty(), "a new copy needs a settled one to copy");
            }
        }
    }
    let before = touched.len();
    touched.sort_unstable();
    touched.dedup();
    assert_eq!(touched.len(), before, "one step per replica");
    let grows = steps.iter().filter(|step| **step == Step::Grow).count();
    assert!(grows <= 1, "at most one replica is added per pass");
    assert!(grows == 0 || steps.last() == Some(&Step::Grow), "a replica is added last");
}

#[cfg(test)]
mod tests;
