//! Placement: which brokers hold the replicas of a segment (and, later, the voters of a vnode).
//!
//! Rendezvous (HRW) hashing ranks every live broker for an object by `xxh3(object ‖ broker)`;
//! constraints over broker attributes then spread the choice across fault domains: the domain of
//! a broker is the value of one attribute (`spread_by`, for example `zone`), a placement must
//! reach a minimum number of distinct domains and keep the replica counts of the domains within
//! a maximum skew. Every node computes the same answer from the same inputs: no randomness, no
//! clock, ties broken by broker id.
//!
//! The choice is greedy, one replica at a time, and takes the first of the candidates left by
//! (replicas already in its domain, not a surviving replica, HRW rank): domains fill evenly,
//! which gives the most distinct domains and the least skew any choice could have, and within
//! that, surviving replicas stay where they are (healing moves as little as it can) and the rest
//! follows the hash (adding or removing one broker moves few objects). A placement that misses a
//! constraint is refused when the constraints are hard, and returned marked as missing them when
//! they are soft.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A broker placement may choose, with the attributes its operator gave it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub broker_id: u64,
    pub attributes: BTreeMap<String, String>,
}

/// Whether a placement that misses its constraints may be used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlacementMode {
    /// It is used, and reported as missing them (writes go on in a degraded cluster).
    #[default]
    Soft,
    /// It is refused.
    Hard,
}

/// Spread constraints over broker attributes (`MALACHI_LOG_SPREAD_BY`, `_MIN_DOMAINS`,
/// `_MAX_SKEW`, `_PLACEMENT_POLICY`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constraints {
    /// The attribute whose values are the fault domains; `None`: every broker is one domain.
    /// A broker without the attribute is in the domain of the empty value.
    pub spread_by: Option<String>,
    /// Distinct domains the replicas must span (0 or 1: no requirement).
    pub min_domains: u32,
    /// The most the replica counts of two domains may differ, over every domain that has a live
    /// broker; `None`: no requirement.
    pub max_skew: Option<u32>,
    pub mode: PlacementMode,
}

/// Where an object's replicas go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The chosen brokers, in the order chosen (the first is the primary).
    pub brokers: Vec<u64>,
    /// False only for soft constraints that could not be met.
    pub constraints_met: bool,
}

/// Why no placement was made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("{replicas} replicas wanted, {live} live brokers")]
    NotEnoughBrokers { replicas: usize, live: usize },
    #[error(
        "the replicas span {domains} domains with skew {skew}, the hard constraints say at least {min_domains} domains and skew at most {max_skew:?}"
    )]
    ConstraintsUnmet { domains: u32, skew: u32, min_domains: u32, max_skew: Option<u32> },
}

/// The HRW score of `broker_id` for `object`: the highest scores win.
pub fn score(object: &[u8], broker_id: u64) -> u64 {
    let mut bytes = Vec::with_capacity(object.len() + 8);
    bytes.extend_from_slice(object);
    bytes.extend_from_slice(&broker_id.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// Chooses `replicas` distinct brokers among `live` for `object`, keeping `survivors` (the
/// object's current replicas) where the constraints allow. `live` may be in any order and may
/// repeat a broker (the first entry counts).
pub fn place(
    object: &[u8],
    replicas: usize,
    live: &[Candidate],
    survivors: &[u64],
    constraints: &Constraints,
) -> Result<Placement, PlacementError> {
    let mut seen = BTreeSet::new();
    let mut ranked: Vec<(&Candidate, u64)> = live
        .iter()
        .filter(|candidate| seen.insert(candidate.broker_id))
        .map(|candidate| (candidate, score(object, candidate.broker_id)))
        .collect();
    if ranked.len() < replicas {
        return Err(PlacementError::NotEnoughBrokers { replicas, live: ranked.len() });
    }
    ranked.sort_by(|(a, a_score), (b, b_score)| {
        b_score.cmp(a_score).then(a.broker_id.cmp(&b.broker_id))
    });
    let domain = |candidate: &Candidate| -> String {
        constraints
            .spread_by
            .as_ref()
            .map(|key| candidate.attributes.get(key).cloned().unwrap_or_default())
            .unwrap_or_default()
    };
    // Every domain with a live broker counts for the skew, chosen or not.
    let mut counts: BTreeMap<String, u32> =
        ranked.iter().map(|(candidate, _)| (domain(candidate), 0)).collect();
    let mut left: Vec<(&Candidate, String)> =
        ranked.iter().map(|(candidate, _)| (*candidate, domain(candidate))).collect();
    let mut brokers = Vec::with_capacity(replicas);
    while brokers.len() < replicas {
        // `left` is in rank order, so the first minimum is the best-ranked of its class.
        let (at, _) = left
            .iter()
            .enumerate()
            .min_by_key(|(at, (candidate, domain))| {
                (counts[domain], !survivors.contains(&candidate.broker_id), *at)
            })
            .expect("enough brokers were checked above");
        let (candidate, domain) = left.remove(at);
        *counts.get_mut(&domain).expect("every domain counted") += 1;
        brokers.push(candidate.broker_id);
    }
    let domains = counts.values().filter(|&&count| count > 0).count() as u32;
    let skew =
        counts.values().max().copied().unwrap_or(0) - counts.values().min().copied().unwrap_or(0);
    let met = domains >= constraints.min_domains
        && constraints.max_skew.is_none_or(|max_skew| skew <= max_skew);
    if !met && constraints.mode == PlacementMode::Hard {
        return Err(PlacementError::ConstraintsUnmet {
            domains,
            skew,
            min_domains: constraints.min_domains,
            max_skew: constraints.max_skew,
        });
    }
    Ok(Placement { brokers, constraints_met: met })
}

/// Parses broker attributes as operators write them: `rack=a,zone=eu-1` (spaces around names
/// and values ignored, an empty string is no attributes).
pub fn parse_attributes(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut attributes = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!("attribute {pair:?} is not name=value"));
        };
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty() {
            return Err(format!("attribute {pair:?} has no name"));
        }
        if attributes.insert(name.to_string(), value.to_string()).is_some() {
            return Err(format!("attribute {name:?} is given twice"));
        }
    }
    Ok(attributes)
}

#[cfg(test)]
mod tests;
