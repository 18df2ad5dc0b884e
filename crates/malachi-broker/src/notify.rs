//! Long-poll wake-ups: a fetch that found nothing parks on its topic's signal, and every produce
//! that lands on the topic bumps it.

use std::collections::BTreeMap;
use std::sync::Mutex;

// Not tokio's watch: its waiters wake in a random order, which a simulated run cannot replay.
use malachi_consensus::watch;

pub use crate::clock::{Clock, SystemClock};

/// Per-topic produce signals.
#[derive(Debug, Default)]
pub struct Notifier {
    topics: Mutex<BTreeMap<u64, watch::Sender<u64>>>,
    /// Fetches waiting for a produce now, per topic.
    parked: Mutex<BTreeMap<u64, usize>>,
}

/// A fetch parked on a topic's signal, counted while it lives.
#[derive(Debug)]
pub struct Parked<'a> {
    notifier: &'a Notifier,
    topic_id: u64,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        let mut parked = self.notifier.parked.lock().expect("notifier lock poisoned");
        let count = parked.get_mut(&self.topic_id).expect("a parked fetch was counted");
        *count -= 1;
        if *count == 0 {
            parked.remove(&self.topic_id);
        }
    }
}

impl Notifier {
    /// A receiver that changes on the next produce to `topic_id`. Subscribe *before* reading, so
    /// a produce that lands between the read and the wait is not missed.
    pub fn subscribe(&self, topic_id: u64) -> watch::Receiver<u64> {
        let mut topics = self.topics.lock().expect("notifier lock poisoned");
        topics.entry(topic_id).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    /// Counts a fetch as parked on `topic_id` until the guard drops.
    pub fn park(&self, topic_id: u64) -> Parked<'_> {
        *self.parked.lock().expect("notifier lock poisoned").entry(topic_id).or_default() += 1;
        Parked { notifier: self, topic_id }
    }

    /// Fetches parked on `topic_id` now.
    pub fn parked(&self, topic_id: u64) -> usize {
        self.parked.lock().expect("notifier lock poisoned").get(&topic_id).copied().unwrap_or(0)
    }

    pub fn notify(&self, topic_id: u64) {
        let topics = self.topics.lock().expect("notifier lock poisoned");
        if let Some(sender) = topics.get(&topic_id) {
            sender.send_modify(|produced| *produced += 1);
        }
    }

    /// Wakes every waiter of a deleted topic and drops its signal.
    pub fn forget(&self, topic_id: u64) {
        let removed = self.topics.lock().expect("notifier lock poisoned").remove(&topic_id);
        if let Some(sender) = removed {
            sender.send_modify(|produced| *produced += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_produce_wakes_a_subscriber_of_its_topic_only() {
        let notifier = Notifier::default();
        let mut orders = notifier.subscribe(1);
        let mut other = notifier.subscribe(2);
        notifier.notify(1);
        assert!(orders.has_changed());
        orders.changed().await.unwrap();
        assert!(!other.has_changed());
        notifier.forget(2);
        other.changed().await.unwrap();
    }
}
