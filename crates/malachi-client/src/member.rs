//! [`GroupMember`]: one member of a consumer group whose members share a topic's ranges (keys
//! 31-34). It joins, reads the ranges it is told one page at a time with each record's
//! position, commits what the caller processed, and heartbeats; an answer that takes a range
//! away is applied before the next heartbeat says so, which is what lets the group hand the range
//! to another member.
//!
//! At-least-once, like [`crate::Consumer`]: a page is committed when the caller asks for the
//! next one. A commit the group refuses (the member lost the range in a rebalance, or its
//! session ran out) is dropped and the member rejoins; the range's new reader starts from the
//! group's position, so those records are read again, never skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use malachi_wire::messages::{Assignment, RangePosition};
use malachi_wire::shapes::{Position, Start};
use malachi_wire::{Reason, Record};
use tokio::time::Instant;

use crate::client::Client;
use crate::error::ClientError;

/// While every range is at its end: how long one wait for new records lasts (ranges are read in
/// turn, so this bounds how late another range's new records are seen), and how often the
/// member re-commits its positions and heartbeats (a range sealed at a position the member
/// committed is drained only by a commit after the seal, which hands its children out).
const IDLE_ROUND: Duration = Duration::from_millis(1_000);

/// Commits of one page tried at successive generations before it is given up (rebalances
/// faster than a commit are a group in turmoil; the records are then read again).
const COMMIT_ATTEMPTS: usize = 4;

/// Heartbeats per session while busy: a range the group takes from this member moves on at
/// its next heartbeat, so this bounds how long a new member waits (3 s of the 30 s session).
const BEATS_PER_SESSION: u32 = 10;
/// A member that has not renewed its session for this fraction of it (a paused process, a cut
/// network) may have lost its ranges: it re-learns them before it hands out what it read.
const STALE_SESSION_DIVISOR: u32 = 2;

/// How a [`GroupMember`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberOptions {
    /// Records per page (0: the server's default, 100).
    pub max: u32,
    /// How long [`GroupMember::next_page`] waits for new records when there are none.
    pub wait: Duration,
    /// Read each range from its oldest retained record instead of the group's position
    /// (commits still go to the group).
    pub from_start: bool,
}

/// A member of `group` reading `topic`.
#[derive(Debug)]
pub struct GroupMember<'a> {
    client: &'a Client,
    topic: String,
    group: String,
    member: String,
    options: MemberOptions,
    /// The assignment acted on: only these ranges are read.
    told: Assignment,
    /// Where reading continues in each told range; absent: the group's position.
    positions: BTreeMap<u32, Position>,
    /// Positions read and returned but not yet committed.
    uncommitted: BTreeMap<u32, Position>,
    /// The next range to read, in turn.
    turn: usize,
    last_beat: Instant,
    /// When the last heartbeat or commit that renewed the session was sent.
    renewed_at: Instant,
    last_idle_round: Option<Instant>,
    /// When each range's position was last committed.
    committed_at: BTreeMap<u32, Instant>,
}

impl<'a> GroupMember<'a> {
    /// Joins `member` to `group` on `topic`.
    pub async fn join(
        client: &'a Client,
        topic: &str,
        group: &str,
        member: &str,
        options: MemberOptions,
    ) -> Result<GroupMember<'a>, ClientError> {
        let renewed_at = Instant::now();
        let told = client.join_group(topic, group, member).await?;
        Ok(GroupMember {
            client,
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            options,
            told,
            positions: BTreeMap::new(),
            uncommitted: BTreeMap::new(),
            turn: 0,
            last_beat: Instant::now(),
            renewed_at,
            last_idle_round: None,
            committed_at: BTreeMap::new(),
        })
    }

    /// The ranges this member reads now.
    pub fn ranges(&self) -> &[u32] {
        &self.told.ranges
    }

    /// Changes the records per page of the next pages.
    pub fn set_max(&mut self, max: u32) {
        self.options.max = max;
    }

    /// The next records of the member's ranges (one range's page), first committing the
    /// previous page. Empty after about `options.wait` with nothing new.
    pub async fn next_page(&mut self) -> Result<Vec<Record>, ClientError> {
        let wait = self.options.wait;
        self.commit().await?;
        if self.last_beat.elapsed()
            >= Duration::from_millis(u64::from(self.told.session_ms / BEATS_PER_SESSION))
        {
            self.heartbeat().await?;
        }
        let deadline = Instant::now() + wait;
        loop {
            for _ in 0..self.told.ranges.len() {
                let range = self.told.ranges[self.turn % self.told.ranges.len()];
                self.turn = self.turn.wrapping_add(1);
                let records = self.read(range, 0).await?;
                if !records.is_empty() {
                    return Ok(records);
                }
            }
            if self.idle_round(wait.is_zero()).await? {
                continue; // told other ranges (children of a range it drained): read them
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            // Wait on one range (in turn) for new records, or only out the round.
            let wait_ms = u32::try_from(left.min(IDLE_ROUND).as_millis()).unwrap_or(u32::MAX);
            let Some(&range) = self.told.ranges.get(self.turn % self.told.ranges.len().max(1))
            else {
                tokio::time::sleep(left.min(IDLE_ROUND)).await;
                continue;
            };
            let records = self.read(range, wait_ms).await?;
            if !records.is_empty() {
                return Ok(records);
            }
        }
    }

    /// Commits what was read and returned. A commit at a generation a rebalance left behind is
    /// made again at the new one, learnt by a join (a heartbeat that applies nothing), so the
    /// member holds every range it read meanwhile; one the group refuses for good (`not_owner`:
    /// the session ran out and another member reads the range) is dropped.
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        for _ in 0..COMMIT_ATTEMPTS {
            if self.uncommitted.is_empty() {
                return Ok(());
            }
            let offsets: Vec<RangePosition> = self
                .uncommitted
                .iter()
                .map(|(&range, &position)| RangePosition { range, position })
                .collect();
            let generation = self.told.generation;
            let sent = Instant::now();
            let member = &self.member;
            let commit =
                self.client.commit_offsets(&self.topic, &self.group, member, generation, offsets);
            match commit.await {
                Ok(()) => {
                    self.renewed_at = sent;
                    let now = Instant::now();
                    self.committed_at.extend(self.uncommitted.keys().map(|&range| (range, now)));
                    self.uncommitted.clear();
                    return Ok(());
                }
                Err(error) if error.reason() == Some(Reason::GenerationMismatch) => {
                    // The new generation, without saying the member applied anything: it
                    // keeps holding every range it read, so the commit can be made again.
                    let told = self.client.join_group(&self.topic, &self.group, &self.member);
                    let told = told.await?;
                    self.apply(told);
                }
                Err(error) if error.reason() == Some(Reason::NotOwner) => break,
                Err(error) => return Err(error),
            }
        }
        // Another member reads these ranges now, from the group's position.
        self.uncommitted.clear();
        self.heartbeat().await
    }

    /// Commits what was read and heartbeats now, applying the answer: a member that just
    /// joined learns the ranges others have given up since, and one that lost ranges to a
    /// newcomer gives them up. [`GroupMember::next_page`] does this on its own every tenth of
    /// the session; a caller that wants the group's shares settled before it starts (a
    /// benchmark's clock) calls it until they are.
    pub async fn refresh(&mut self) -> Result<(), ClientError> {
        self.commit().await?;
        self.heartbeat().await
    }

    /// Leaves the group at once, so the others take the ranges over now.
    pub async fn leave(self) -> Result<(), ClientError> {
        self.client.leave_group(&self.topic, &self.group, &self.member).await
    }

    /// Heartbeats having applied the current assignment, and applies the answer.
    async fn heartbeat(&mut self) -> Result<(), ClientError> {
        let sent = Instant::now();
        let beat = self.client.group_heartbeat(
            &self.topic,
            &self.group,
            &self.member,
            self.told.generation,
        );
        let told = beat.await?;
        self.last_beat = Instant::now();
        self.renewed_at = sent;
        self.apply(told);
        Ok(())
    }

    /// Reads only the ranges `told` names from now on (their positions are kept). What was
    /// read of the others is still committed: the member holds them until its next heartbeat.
    fn apply(&mut self, told: Assignment) {
        self.positions.retain(|range, _| told.ranges.contains(range));
        self.committed_at.retain(|range, _| told.ranges.contains(range));
        self.told = told;
    }

    /// Every range is at its end: at most once a round (unless `now`), commit every position
    /// (a range sealed since is then drained) and heartbeat (children of drained ranges are
    /// then handed out). Whether the member's ranges changed.
    async fn idle_round(&mut self, now: bool) -> Result<bool, ClientError> {
        if !now && self.last_idle_round.is_some_and(|at| at.elapsed() < IDLE_ROUND) {
            return Ok(false);
        }
        self.last_idle_round = Some(Instant::now());
        let before = self.told.ranges.clone();
        self.uncommitted.extend(self.positions.iter().map(|(&range, &position)| (range, position)));
        self.commit().await?;
        self.heartbeat().await?;
        Ok(self.told.ranges != before)
    }

    /// Whether the session went unrenewed for long enough that the ranges may be another's.
    fn session_may_have_run_out(&self) -> bool {
        let session = Duration::from_millis(u64::from(self.told.session_ms));
        self.renewed_at.elapsed() >= session / STALE_SESSION_DIVISOR
    }

    async fn read(&mut self, range: u32, wait_ms: u32) -> Result<Vec<Record>, ClientError> {
        let start = match self.positions.get(&range) {
            Some(&position) => Start::Position(position),
            None if self.options.from_start => Start::Earliest,
            None => Start::Group(Some(self.group.clone().into())),
        };
        let max = self.options.max;
        let (page, entries) =
            self.client.fetch_range(&self.topic, range, start, max, wait_ms).await?;
        if !entries.is_empty() && self.session_may_have_run_out() {
            // Silent for half a session (paused, cut off): the group may have handed the range
            // to another member, who reads it too. Learn first; if the range is still ours,
            // the page is read again from the same position.
            self.heartbeat().await?;
            return Ok(Vec::new());
        }
        self.positions.insert(range, page.next);
        let stale = self.committed_at.get(&range).is_none_or(|at| at.elapsed() >= IDLE_ROUND);
        if !entries.is_empty() || stale {
            // A range at its end is committed again now and then, even while others keep the
            // member busy: if it was sealed since, that commit drains it.
            self.uncommitted.insert(range, page.next);
        }
        Ok(entries.into_iter().map(|entry| entry.record).collect())
    }
}
