//! Long-poll wake-ups: a fetch that found nothing parks on its topic's signal, and every produce
//! that lands on the topic bumps it.

use std::collections::BTreeMap;
use std::sync::Mutex;

// Not tokio's watch: its waiters wake in a random order, which a simulated run cannot replay.
use malachi_consensus::watch;

/// Per-topic produce signals.
#[derive(Debug, Default)]
pub struct Notifier {
    topics: Mutex<BTreeMap<u64, watch::Sender<u64>>>,
}

impl Notifier {
    /// A receiver that changes on the next produce to `topic_id`. Subscribe *before* reading, so
    /// a produce that lands between the read and the wait is not missed.
    pub fn subscribe(&self, topic_id: u64) -> watch::Receiver<u64> {
        let mut topics = self.topics.lock().expect("notifier lock poisoned");
        topics.entry(topic_id).or_insert_with(|| watch::channel(0).0).subscribe()
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

/// Wall-clock milliseconds, handed to decision logic that must not read a clock itself.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> u64;
}

/// The system clock, for the real broker.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_millis() as u64)
            .unwrap_or(0)
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
