//! The entry point: runs the passes in order over one history.
//!
//! 1. [`crate::ops`] pairs invokes with completions (malformed events are reported and dropped).
//! 2. [`crate::writes`] indexes every written value over its retry family.
//! 3. [`crate::chains`] judges every cursor chain; [`crate::drain`] every drain, then lost writes.
//! 4. [`crate::groups`] judges committed group positions.
//!
//! Each pass is linear or O(n log n) in the history's size; nothing compares all pairs.

use crate::chains::check_chains;
use crate::drain::check_drains;
use crate::groups::check_groups;
use crate::history::History;
use crate::ops::pair_events;
use crate::report::{CheckReport, Stats, Violation};
use crate::sequence::SequenceChecker;
use crate::writes::index_writes;

/// What the passes accumulate.
#[derive(Default)]
pub(crate) struct Findings {
    pub violations: Vec<Violation>,
    pub stats: Stats,
}

/// Judges `history`; see the crate documentation for the checks.
pub fn check(history: &History) -> CheckReport {
    let mut findings = Findings::default();
    findings.stats.events = history.events().len() as u64;
    let table = pair_events(history.events(), &mut findings.violations);
    let writes = index_writes(&table, &mut findings);
    let mut checker = SequenceChecker::new(&writes);
    check_chains(&table, &mut checker, &mut findings);
    check_drains(&table, &writes, &mut checker, &mut findings);
    findings.stats.retried_duplicates = checker.retried_duplicates();
    check_groups(&table, &mut findings);
    CheckReport::new(findings.violations, findings.stats)
}
