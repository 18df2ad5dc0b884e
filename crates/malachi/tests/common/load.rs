//! A produce load for the cluster tests: producers writing keyed batches through real brokers
//! while brokers are killed or cut off, and the check that every acknowledged record is read
//! back afterwards, each key in order.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use malachi_client::{Client, ClientConfig, RecordBuilder, TlsOptions};

/// What each key had acknowledged, by sequence.
pub type Acked = BTreeMap<String, Vec<u64>>;

/// Producers writing batches of 4 keyed records (a sequence per key), recording what was
/// acknowledged and when.
pub struct Load {
    acked: Arc<Mutex<Acked>>,
    acked_at: Arc<Mutex<Vec<Instant>>>,
    /// The same, by producer.
    producer_acks: Arc<Mutex<BTreeMap<usize, Vec<Instant>>>>,
    /// Produce calls that failed (each retried as a new batch after a reconnect).
    failures: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// `count` producers logged in as `admin` with `password`, producer `i` writing to
    /// `topics[i % topics.len()]` through the broker at `addresses[i % addresses.len()]`,
    /// reconnecting after a failure to the next broker of `addresses` (its own may be killed,
    /// paused or restarting; a client of a cluster moves on as one would).
    pub fn start(addresses: &[String], topics: &[&str], count: usize, password: &str) -> Load {
        Load::start_with(addresses, topics, count, password, 0)
    }

    /// [`Load::start`] with every record's value padded to at least `value_bytes` (the padding
    /// follows a `#`, which [`assert_read_back`] drops).
    pub fn start_with(
        addresses: &[String],
        topics: &[&str],
        count: usize,
        password: &str,
        value_bytes: usize,
    ) -> Load {
        Load::start_over(addresses, topics, count, password, value_bytes, None)
    }

    /// [`Load::start_with`], speaking TLS with `tls` when given.
    pub fn start_over(
        addresses: &[String],
        topics: &[&str],
        count: usize,
        password: &str,
        value_bytes: usize,
        tls: Option<TlsOptions>,
    ) -> Load {
        let acked: Arc<Mutex<Acked>> = Arc::default();
        let acked_at: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let producer_acks: Arc<Mutex<BTreeMap<usize, Vec<Instant>>>> = Arc::default();
        let failures: Arc<AtomicUsize> = Arc::default();
        let stop: Arc<AtomicBool> = Arc::default();
        let producers = (0..count)
            .map(|producer| {
                let addresses = addresses.to_vec();
                let topic = topics[producer % topics.len()].to_string();
                let password = password.to_string();
                let (acked, acked_at) = (Arc::clone(&acked), Arc::clone(&acked_at));
                let producer_acks = Arc::clone(&producer_acks);
                let failures = Arc::clone(&failures);
                let stop = Arc::clone(&stop);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let mut at = producer % addresses.len();
                    let connect = |at: usize| {
                        let config = ClientConfig::new(addresses[at].clone())
                            .credentials("admin", password.as_str());
                        super::connect_with(match &tls {
                            Some(tls) => config.tls(tls.clone()),
                            None => config,
                        })
                    };
                    let mut client = connect(at).await.unwrap();
                    let keys: Vec<String> =
                        (0..4).map(|k| format!("{topic}/p{producer}k{k}")).collect();
                    for sequence in 0u64.. {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let batch = keys
                            .iter()
                            .map(|key| {
                                let value = padded(format!("{key}={sequence}"), value_bytes);
                                RecordBuilder::new(value).key(key).build()
                            })
                            .collect();
                        match client.produce(&topic, batch).await {
                            Ok(_) => {
                                let mut acked = acked.lock().unwrap();
                                for key in &keys {
                                    acked.entry(key.clone()).or_default().push(sequence);
                                }
                                let now = Instant::now();
                                acked_at.lock().unwrap().push(now);
                                let mut by_producer = producer_acks.lock().unwrap();
                                by_producer.entry(producer).or_default().push(now);
                            }
                            Err(_) => {
                                failures.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                at = (at + 1) % addresses.len();
                                if let Ok(fresh) = connect(at).await {
                                    client = fresh;
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        Load { acked, acked_at, producer_acks, failures, stop, producers }
    }

    /// Records acknowledged so far.
    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().values().map(Vec::len).sum()
    }

    /// When each producer's acknowledgements came so far, in order.
    #[allow(dead_code)] // Only some of the test binaries that share this module ask.
    pub fn producer_acks(&self) -> BTreeMap<usize, Vec<Instant>> {
        self.producer_acks.lock().unwrap().clone()
    }

    /// Produce calls that have failed so far.
    pub fn failure_count(&self) -> usize {
        self.failures.load(Ordering::Relaxed)
    }

    /// Stops the producers; what each key had acknowledged, and when every acknowledgement
    /// came, in order.
    pub async fn stop(self) -> (Acked, Vec<Instant>) {
        self.stop.store(true, Ordering::Relaxed);
        for producer in self.producers {
            producer.await.unwrap();
        }
        let acked = self.acked.lock().unwrap().clone();
        let mut acked_at = self.acked_at.lock().unwrap().clone();
        acked_at.sort();
        (acked, acked_at)
    }
}

/// `value`, then `#` and filler up to `bytes` when it is shorter.
fn padded(mut value: String, bytes: usize) -> String {
    if value.len() < bytes {
        value.push('#');
        value.extend(std::iter::repeat_n('x', bytes.saturating_sub(value.len())));
    }
    value
}

/// Every acknowledged record of `topics` is read back through `client`'s broker, once, and each
/// key's acknowledged records in the order they were produced (design.md invariant 6: a record
/// acknowledged before the next was sent precedes it). A record whose produce failed (its
/// outcome unknown: the producer moved on without retrying it) may still land, and later than
/// records sent after it; that is not a violation, and it is counted, not failed.
pub async fn assert_read_back(client: &Client, topics: &[&str], acked: &Acked) {
    let mut read: Acked = BTreeMap::new();
    for topic in topics {
        let (records, _) = super::drain(client, topic, None).await;
        for record in records {
            let value = super::value(&record);
            let value = value.split('#').next().unwrap();
            let (key, sequence) = value.split_once('=').unwrap();
            read.entry(key.to_string()).or_default().push(sequence.parse().unwrap());
        }
    }
    let mut late_unacknowledged = 0;
    for (key, sequences) in acked {
        let got = read.get(key).cloned().unwrap_or_default();
        let distinct: std::collections::BTreeSet<u64> = got.iter().copied().collect();
        assert_eq!(distinct.len(), got.len(), "{key}: a record read twice {got:?}");
        let acknowledged: std::collections::BTreeSet<u64> = sequences.iter().copied().collect();
        let in_order: Vec<u64> =
            got.iter().copied().filter(|sequence| acknowledged.contains(sequence)).collect();
        assert!(
            in_order.windows(2).all(|pair| pair[0] < pair[1]),
            "{key}: acknowledged records out of order {in_order:?}"
        );
        late_unacknowledged += got.windows(2).filter(|pair| pair[0] > pair[1]).count();
        let missing: Vec<&u64> = sequences.iter().filter(|s| !distinct.contains(s)).collect();
        assert!(missing.is_empty(), "{key}: acknowledged and lost {missing:?}");
    }
    if late_unacknowledged > 0 {
        eprintln!("{late_unacknowledged} records whose produce failed landed after later ones");
    }
}
