//! Peer names resolved without letting a slow resolver starve the process.
//!
//! `TcpStream::connect("broker2:4042")` resolves the name on tokio's blocking pool, the pool
//! every storage call runs on. Under Docker a stopped container's name takes about 15 s to fail
//! (the network's DNS forwards it upstream), and a broker dials a stopped peer on every call to
//! it: the lookups filled all 512 blocking threads of both other brokers of a compose cluster,
//! every append then waited behind them, and every head lost its quorum at once.
//!
//! Here at most one lookup per name runs at a time, on a task of its own; a dial uses the last
//! addresses the name resolved to at once and the lookup it starts corrects them for the next
//! dial (a container that came back elsewhere is reached on the dial after). Only a name never
//! resolved waits for its lookup, bounded by the caller's connect timeout.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// Looks a `host:port` up: the system resolver for brokers, a scripted one for tests.
pub type Lookup = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>
        + Send
        + Sync,
>;

/// What is known of one name.
#[derive(Clone, Debug, Default)]
struct Answer {
    /// What the name last resolved to; kept across failed lookups.
    found: Option<Arc<[SocketAddr]>>,
    /// Why the last lookup failed, if it did.
    error: Option<String>,
}

#[derive(Debug)]
struct Name {
    answer: watch::Sender<Answer>,
    looking_up: AtomicBool,
}

/// Resolves peers' `host:port` addresses, one lookup per name at a time.
pub struct Resolver {
    lookup: Lookup,
    names: Mutex<BTreeMap<String, Arc<Name>>>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver").field("names", &self.names).finish_non_exhaustive()
    }
}

impl Default for Resolver {
    /// The system resolver (`getaddrinfo`, on tokio's blocking pool).
    fn default() -> Resolver {
        Resolver::with_lookup(Arc::new(|address: String| {
            Box::pin(async move { Ok(tokio::net::lookup_host(address).await?.collect()) })
        }))
    }
}

impl Resolver {
    pub fn with_lookup(lookup: Lookup) -> Resolver {
        Resolver { lookup, names: Mutex::new(BTreeMap::new()) }
    }

    /// The addresses `address` (`host:port`, or an IP address and port) stands for.
    pub async fn resolve(&self, address: &str) -> io::Result<Vec<SocketAddr>> {
        if let Ok(literal) = address.parse::<SocketAddr>() {
            return Ok(vec![literal]);
        }
        let name = self.name(address);
        let mut answers = name.answer.subscribe();
        let known = answers.borrow_and_update().found.clone();
        self.look_up(address, &name);
        if let Some(found) = known {
            return Ok(found.to_vec());
        }
        // Never resolved: the answer of the lookup running now.
        answers
            .changed()
            .await
            .map_err(|_| io::Error::other(format!("resolving {address}: resolver dropped")))?;
        let answer = answers.borrow().clone();
        match (answer.found, answer.error) {
            (Some(found), _) => Ok(found.to_vec()),
            (None, error) => Err(io::Error::other(format!(
                "resolving {address}: {}",
                error.unwrap_or_else(|| "no address".into())
            ))),
        }
    }

    /// What `address` resolved to last, without waiting: `None` for a name not resolved yet.
    /// Starts a lookup unless one runs, so a loop that must not stall (gossip) learns a new
    /// name, or a name's new addresses, on a later turn.
    pub fn known(&self, address: &str) -> Option<Vec<SocketAddr>> {
        if let Ok(literal) = address.parse::<SocketAddr>() {
            return Some(vec![literal]);
        }
        let name = self.name(address);
        let known = name.answer.borrow().found.clone();
        self.look_up(address, &name);
        known.map(|found| found.to_vec())
    }

    /// What `address` resolved to last, without waiting and without starting a lookup: for a
    /// loop that refreshes each name on its own schedule (gossip turns many times a second).
    pub fn last(&self, address: &str) -> Option<Vec<SocketAddr>> {
        if let Ok(literal) = address.parse::<SocketAddr>() {
            return Some(vec![literal]);
        }
        let found = self.name(address).answer.borrow().found.clone();
        found.map(|found| found.to_vec())
    }

    fn name(&self, address: &str) -> Arc<Name> {
        let mut names = self.names.lock().expect("resolver lock poisoned");
        let name = names.entry(address.to_string()).or_insert_with(|| {
            Arc::new(Name {
                answer: watch::Sender::new(Answer::default()),
                looking_up: false.into(),
            })
        });
        Arc::clone(name)
    }

    /// Starts a lookup of `address` unless one is running.
    fn look_up(&self, address: &str, name: &Arc<Name>) {
        if name.looking_up.swap(true, Ordering::AcqRel) {
            return;
        }
        let lookup = (self.lookup)(address.to_string());
        let name = Arc::clone(name);
        tokio::spawn(async move {
            let result = lookup.await;
            name.looking_up.store(false, Ordering::Release);
            name.answer.send_modify(|answer| match result {
                Ok(found) if !found.is_empty() => {
                    *answer = Answer { found: Some(found.into()), error: None };
                }
                Ok(_) => answer.error = Some("no address".into()),
                Err(error) => answer.error = Some(error.to_string()),
            });
        });
    }
}

#[cfg(test)]
mod tests;
