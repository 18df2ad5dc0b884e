//! Quorum replication of one active segment, seen from its primary: sans-IO.
//!
//! The primary (the first broker of the segment's replica set) appends each batch to its own
//! copy and ships it to every follower; a record is acknowledged once `q = floor(n/2) + 1`
//! replicas, the primary among them, reported it durable (design.md, invariant 3). The driver
//! tells the machine what happens (a batch staged here, this broker's own fsync, a follower's
//! answer, a follower out of reach, the time) and carries out what it asks: ship a span of
//! records to a follower, acknowledge up to an offset, fail what cannot reach a quorum.
//!
//! Shipping is pipelined and windowed: a follower has at most `window_batches` spans and about
//! `window_bytes` in flight, and is sent the next span as soon as one is answered. A follower
//! that answers with an end other than the one shipped to it (it lost unsynced records in a
//! crash, or missed a span) is shipped again from its end; spans the primary no longer holds in
//! memory are shipped from its file (`Ship` says only which offsets). A span answered short of its
//! end (the driver read fewer records from the file than the span covers) is shipped on from the
//! follower's new end. A follower out of reach is shipped nothing until it answers again.
//!
//! Each reset of a follower's window (a refusal, the follower out of reach) starts a new
//! *window epoch*, and every `Ship` carries the epoch it was sent in. A refusal or a failure
//! answered for a span of an earlier epoch is stale and changes nothing: the window it belonged
//! to was already shipped again. Without this, the other spans of a refused window, refused in
//! turn, each reset and reshipped the whole window, and the spans in flight multiplied (a chaos
//! drill saw a broker grow to 19 GiB after a SIGCONT).
//!
//! What it never does: acknowledge a record fewer than `q` replicas reported durable; move the
//! acknowledged end backwards; let a window grow past its bounds. A batch that has not reached
//! a quorum `quorum_wait_ms` after it was staged is answered `NoQuorum`, and so is every later
//! one: the segment is then sealed by failover (at the highest durable end a quorum of its
//! replicas reports), never written further here.

use std::collections::{BTreeMap, VecDeque};

/// Bounds of the replication of one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// Spans in flight to one follower.
    pub window_batches: usize,
    /// Bytes in flight to one follower; one span is always allowed, however large.
    pub window_bytes: u64,
    /// How long a batch may wait for a quorum before it is refused (`no_quorum`).
    pub quorum_wait_ms: u64,
    /// Records in one span shipped from the file (a follower catching up).
    pub catch_up_records_max: u64,
    /// Bytes of staged batches held in memory for followers that have not got them yet. Past
    /// it, batches a quorum acknowledged and this broker holds durable are dropped even if a
    /// follower in reach still lacks them (a slow one that still answers): it is shipped them
    /// from the file instead, so no follower pins a whole segment in the primary's memory.
    pub held_bytes_max: u64,
    /// Canary (a deliberate bug, for the simulator to catch): a span answered short of its
    /// end stays in flight, as before issue 25's fix, and the follower is shipped nothing more.
    pub canary_short_answer_wedges: bool,
}

impl Default for ReplicationConfig {
    fn default() -> ReplicationConfig {
        ReplicationConfig {
            window_batches: 16,
            window_bytes: 16 << 20,
            quorum_wait_ms: 2_000,
            catch_up_records_max: 4_096,
            held_bytes_max: 64 << 20,
            canary_short_answer_wedges: false,
        }
    }
}

/// What the machine asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send records `[start, end)` of the segment to `follower` (from memory while the primary
    /// holds the batch, else from its file). Its answer goes back with `epoch`.
    Ship { follower: u64, start: u64, end: u64, epoch: u64 },
    /// Records below `end` are durable on a quorum: acknowledge the produces waiting on them;
    /// readers may see them. Never smaller than an earlier `Acked`.
    Acked { end: u64 },
    /// Records from `from` on cannot reach a quorum: fail the produces waiting on them with
    /// `no_quorum`; the segment takes no more appends and must be sealed by failover.
    NoQuorum { from: u64 },
}

/// The quorum of a replica set of `replicas` brokers: `floor(n/2) + 1`.
pub fn quorum(replicas: usize) -> usize {
    replicas / 2 + 1
}

/// The fewest brokers a new segment may be placed on when not all of the `wanted` replicas can
/// be live ones: its acknowledgement quorum must still count as many copies as a full set's
/// (`quorum(fewest) >= quorum(wanted)`), so a record acknowledged in a degraded cluster is on
/// as many disks as one acknowledged in a whole one. 2 of 3, 4 of 5; below that a new segment
/// is refused (`no_quorum`) rather than placed on one copy.
pub fn replicas_fewest(wanted: usize) -> usize {
    (2 * (wanted / 2)).max(1)
}

/// The end that `quorum` of the replicas' durable `ends` reach: the `quorum`-th highest (0 when
/// there are fewer ends than that).
pub fn quorum_end(ends: impl IntoIterator<Item = u64>, quorum: usize) -> u64 {
    assert!(quorum >= 1, "a quorum has at least one replica");
    let mut ends: Vec<u64> = ends.into_iter().collect();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    ends.get(quorum - 1).copied().unwrap_or(0)
}

/// A batch staged on the primary, kept until every follower in reach has it durable.
#[derive(Clone, Copy, Debug)]
struct Staged {
    start: u64,
    end: u64,
    bytes: u64,
    staged_ms: u64,
}

/// A span shipped to a follower and not answered yet.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    end: u64,
    bytes: u64,
    /// Shipped from the file (the records are no longer held in memory).
    from_file: bool,
}

#[derive(Debug, Default)]
struct Follower {
    /// The next offset to ship.
    next: u64,
    /// The durable end it last reported.
    durable: u64,
    in_flight: VecDeque<Span>,
    in_flight_bytes: u64,
    /// Out of reach: shipped nothing until it answers again.
    unreachable: bool,
    /// The window epoch: one more at each reset of the window.
    epoch: u64,
}

/// The primary's side of one segment's replication.
#[derive(Debug)]
pub struct Primary {
    config: ReplicationConfig,
    quorum: usize,
    /// Where this broker's own copy is durable to.
    local_durable: u64,
    /// The end of what was staged here.
    staged_end: u64,
    staged: VecDeque<Staged>,
    /// The bytes of `staged`.
    staged_bytes: u64,
    followers: BTreeMap<u64, Follower>,
    acked_end: u64,
    /// Set once a batch missed its quorum: the segment takes nothing more.
    no_quorum_from: Option<u64>,
    actions: Vec<Action>,
}

impl Primary {
    /// The primary of a segment whose replicas are this broker and `followers`, every copy
    /// holding (durably) the records below `durable_end`, as after the segment was created
    /// (0) or sealed elsewhere and reopened.
    pub fn new(followers: &[u64], durable_end: u64, config: ReplicationConfig) -> Primary {
        assert!(config.window_batches >= 1, "a window holds at least one span");
        assert!(config.catch_up_records_max >= 1, "a catch-up span holds at least one record");
        let followers: BTreeMap<u64, Follower> = followers
            .iter()
            .map(|&node| {
                (node, Follower { next: durable_end, durable: durable_end, ..Follower::default() })
            })
            .collect();
        Primary {
            config,
            quorum: quorum(followers.len() + 1),
            local_durable: durable_end,
            staged_end: durable_end,
            staged: VecDeque::new(),
            staged_bytes: 0,
            followers,
            acked_end: durable_end,
            no_quorum_from: None,
            actions: Vec::new(),
        }
    }

    /// Records below this are durable on a quorum.
    /// How many staged records each follower has yet to make durable.
    pub fn follower_lag(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let staged_end = self.staged_end;
        self.followers.iter().map(move |(&node, f)| (node, staged_end.saturating_sub(f.durable)))
    }

    /// `follower`'s window epoch: the epoch of what is shipped to it now.
    pub fn window_epoch(&self, follower: u64) -> Option<u64> {
        self.followers.get(&follower).map(|state| state.epoch)
    }

    pub fn acked_end(&self) -> u64 {
        self.acked_end
    }

    /// Whether the segment still takes appends (no batch missed its quorum).
    pub fn writable(&self) -> bool {
        self.no_quorum_from.is_none()
    }

    /// The end of what was staged here.
    pub fn staged_end(&self) -> u64 {
        self.staged_end
    }

    /// The first offset still held in memory for shipping: records below it are on every
    /// follower in reach and durable here, so the driver may drop them (later spans below it
    /// are shipped from the file).
    pub fn held_from(&self) -> u64 {
        self.staged.front().map_or(self.staged_end, |batch| batch.start)
    }

    /// What the driver must do now, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// A batch of records `[start, end)` (`bytes` on the wire) was staged on this broker at
    /// `now_ms`. Batches are staged in order, each starting where the last ended.
    pub fn staged(&mut self, start: u64, end: u64, bytes: u64, now_ms: u64) {
        assert_eq!(start, self.staged_end, "batches are staged contiguously");
        assert!(end > start, "a batch holds at least one record");
        self.staged_end = end;
        if let Some(from) = self.no_quorum_from {
            // Nothing more reaches a quorum here: refuse at once.
            self.actions.push(Action::NoQuorum { from });
            return;
        }
        self.staged.push_back(Staged { start, end, bytes, staged_ms: now_ms });
        self.staged_bytes += bytes;
        self.ship_all();
        self.advance();
    }

    /// This broker's own copy is durable to `end`.
    pub fn local_durable(&mut self, end: u64) {
        assert!(end <= self.staged_end, "durable past what was staged");
        self.local_durable = self.local_durable.max(end);
        self.advance();
    }

    /// `follower` appended what it was shipped and its copy is durable to `end`. Answers may
    /// arrive out of order: one that says less than an earlier one is stale and changes nothing.
    pub fn follower_durable(&mut self, follower: u64, end: u64) {
        // A follower never holds more than it was shipped; an answer saying so is not
        // trusted (it comes from another broker: input, never a reason to panic).
        if end > self.staged_end {
            return;
        }
        let Some(state) = self.followers.get_mut(&follower) else { return };
        state.unreachable = false;
        while state.in_flight.front().is_some_and(|span| span.end <= end) {
            let span = state.in_flight.pop_front().expect("front exists");
            state.in_flight_bytes -= span.bytes;
        }
        // The oldest span answered short of its end: it carried fewer records than it covers
        // (a span read from the file is cut at the driver's byte cap). It is done with, and
        // with nothing behind it the follower is shipped on from its end; spans behind it
        // start past that end and are refused, which ships it again from there. Before this,
        // the span stayed in flight for good and, as nothing follows a span from the file, the
        // follower was shipped nothing more: the segment ran on one copy fewer.
        let short = state.in_flight.front().is_some_and(|span| span.start < end && end < span.end);
        if short && !crate::canary(self.config.canary_short_answer_wedges) {
            let span = state.in_flight.pop_front().expect("front exists");
            state.in_flight_bytes -= span.bytes;
            if state.in_flight.is_empty() {
                state.next = end;
            }
        }
        state.durable = state.durable.max(end);
        state.next = state.next.max(end);
        self.ship(follower);
        self.advance();
    }

    /// `follower` refused a span shipped in window `epoch` because its copy ends at `end`, not
    /// where the span started: it lost records it had not synced (a crash), or missed a span.
    /// What is in flight to it is dropped and it is shipped again from `end`, which is its
    /// durable end from now on. A refusal of an earlier epoch is stale and changes nothing.
    pub fn follower_refused(&mut self, follower: u64, end: u64, epoch: u64) {
        let staged_end = self.staged_end;
        let Some(state) = self.followers.get_mut(&follower) else { return };
        if epoch != state.epoch {
            return;
        }
        state.epoch += 1;
        state.unreachable = false;
        state.in_flight.clear();
        state.in_flight_bytes = 0;
        state.durable = end.min(staged_end);
        state.next = state.durable;
        self.ship(follower);
        self.advance();
    }

    /// `follower` could not be reached with a span of window `epoch` (its connection failed,
    /// or membership holds it dead): what was in flight to it is lost; it is shipped nothing
    /// until it answers again. A failure of an earlier epoch is stale and changes nothing.
    /// Returns whether this failure put the follower out of reach: only then does the driver
    /// [`Primary::retry_follower`] after its pause. The other spans of the window fail too,
    /// and when calls fail at once (membership holds the follower dead) each of them retrying
    /// would ship a window whose every span retries in turn: the chaos drill saw a primary
    /// spawn a million shipping tasks in seconds and pass 2 GiB.
    #[must_use = "only the failure that put the follower out of reach retries it"]
    pub fn follower_unreachable(&mut self, follower: u64, epoch: u64) -> bool {
        let Some(state) = self.followers.get_mut(&follower) else { return false };
        if epoch != state.epoch {
            return false;
        }
        state.epoch += 1;
        state.unreachable = true;
        state.in_flight.clear();
        state.in_flight_bytes = 0;
        state.next = state.durable;
        true
    }

    /// A follower out of reach is tried again from its durable end (the driver calls this on
    /// its retry cadence).
    pub fn retry_follower(&mut self, follower: u64) {
        let Some(state) = self.followers.get_mut(&follower) else { return };
        if state.unreachable {
            state.unreachable = false;
            self.ship(follower);
        }
    }

    /// A follower refused an append because its copy is sealed (the segment is being sealed by
    /// failover elsewhere): nothing past the acknowledged end can be acknowledged any more.
    pub fn fence(&mut self) {
        if self.no_quorum_from.is_none() {
            self.no_quorum_from = Some(self.acked_end);
            self.actions.push(Action::NoQuorum { from: self.acked_end });
        }
    }

    /// The time is `now_ms`: a batch that waited for a quorum too long is refused, with every
    /// later one.
    pub fn tick(&mut self, now_ms: u64) {
        if self.no_quorum_from.is_some() {
            return;
        }
        let late = self.staged.iter().find(|batch| {
            batch.end > self.acked_end
                && now_ms >= batch.staged_ms.saturating_add(self.config.quorum_wait_ms)
        });
        if let Some(batch) = late {
            let from = batch.start.max(self.acked_end);
            self.no_quorum_from = Some(from);
            self.actions.push(Action::NoQuorum { from });
        }
    }

    fn ship_all(&mut self) {
        let followers: Vec<u64> = self.followers.keys().copied().collect();
        for follower in followers {
            self.ship(follower);
        }
    }

    /// Ships `follower` what its window allows: staged batches from its next offset on, or, for
    /// offsets no longer staged, one span up to the first staged batch. A span from the file
    /// goes alone: it is shipped only with nothing else in flight, and nothing follows it until
    /// it is answered. Its records are read (up to `catch_up_records_max`, megabytes) and held
    /// while the call is out, and a span behind it would arrive first and be refused; shipping
    /// a window of them at once held sixteen such spans per segment and follower while a dead
    /// broker's connections timed out (a chaos drill saw a broker pass 2 GiB).
    fn ship(&mut self, follower: u64) {
        let state = self.followers.get_mut(&follower).expect("a known follower");
        if state.unreachable || self.no_quorum_from.is_some() {
            return;
        }
        while state.next < self.staged_end
            && state.in_flight.len() < self.config.window_batches
            && !state.in_flight.iter().any(|span| span.from_file)
        {
            let (end, bytes) = match self.staged.iter().find(|batch| batch.end > state.next) {
                Some(batch) if batch.start <= state.next => (batch.end, batch.bytes),
                // Below what is staged: from the file, up to the first staged batch.
                Some(batch) => (batch.start, 0),
                None => (self.staged_end, 0),
            };
            let end = if bytes == 0 {
                end.min(state.next + self.config.catch_up_records_max)
            } else {
                end
            };
            let from_file = bytes == 0;
            let over = state.in_flight_bytes + bytes > self.config.window_bytes;
            if (over || from_file) && !state.in_flight.is_empty() {
                break;
            }
            let epoch = state.epoch;
            self.actions.push(Action::Ship { follower, start: state.next, end, epoch });
            state.in_flight.push_back(Span { start: state.next, end, bytes, from_file });
            state.in_flight_bytes += bytes;
            state.next = end;
        }
    }

    /// Moves the acknowledged end to what a quorum holds durable, and drops staged batches
    /// every follower in reach has and this broker holds durable (so a span shipped from the
    /// file later finds its records there).
    fn advance(&mut self) {
        let ends = self.followers.values().map(|state| state.durable);
        let quorum_end = quorum_end(ends.chain([self.local_durable]), self.quorum);
        let limit = self.no_quorum_from.unwrap_or(u64::MAX);
        let acked = quorum_end.min(limit);
        if acked > self.acked_end {
            self.acked_end = acked;
            self.actions.push(Action::Acked { end: acked });
        }
        let everywhere = self
            .followers
            .values()
            .filter(|state| !state.unreachable)
            .map(|state| state.durable)
            .min()
            .unwrap_or(u64::MAX)
            .min(self.acked_end)
            .min(self.local_durable);
        let droppable = self.acked_end.min(self.local_durable);
        while let Some(batch) = self.staged.front().copied() {
            let over_budget = self.staged_bytes > self.config.held_bytes_max;
            if batch.end > everywhere && !(over_budget && batch.end <= droppable) {
                break;
            }
            self.staged.pop_front();
            self.staged_bytes -= batch.bytes;
        }
        self.check();
    }

    /// The machine's invariants, on every step.
    fn check(&self) {
        assert!(self.acked_end <= self.staged_end, "acknowledged past what was staged");
        debug_assert_eq!(
            self.staged_bytes,
            self.staged.iter().map(|batch| batch.bytes).sum::<u64>(),
            "staged bytes counted"
        );
        // Over the budget, only batches a quorum has not acknowledged (or not durable here) are
        // held: the first one held is one of them.
        if self.staged_bytes > self.config.held_bytes_max
            && let Some(batch) = self.staged.front()
        {
            assert!(batch.end > self.acked_end.min(self.local_durable), "held over the budget");
        }
        assert!(self.local_durable <= self.staged_end, "durable past what was staged");
        for (node, state) in &self.followers {
            assert!(state.in_flight.len() <= self.config.window_batches, "window of {node}");
            assert!(state.next <= self.staged_end, "{node} shipped past the staged end");
            assert!(state.durable <= state.next, "{node} durable past what was shipped");
            // Spans in flight follow each other and start at or past what the follower holds
            // durable, so an answer inside the first one is a short answer, never a stale one.
            let mut expected_start =
                state.in_flight.front().map_or(state.durable, |span| span.start);
            // (The canary keeps a span answered short in flight, below the end it answered.)
            assert!(
                expected_start >= state.durable
                    || crate::canary(self.config.canary_short_answer_wedges),
                "{node} shipped below its durable end"
            );
            for span in &state.in_flight {
                assert_eq!(span.start, expected_start, "{node}'s spans in flight have a gap");
                expected_start = span.end;
            }
        }
    }
}

#[cfg(test)]
mod tests;
