use std::sync::atomic::AtomicU64;

use tokio::sync::Semaphore;

use super::*;

/// A resolver whose lookups count themselves and finish only when the test releases them,
/// with the answers the test scripted (in order; the last one repeats).
struct Scripted {
    resolver: Resolver,
    lookups: Arc<AtomicU64>,
    release: Arc<Semaphore>,
}

fn scripted(answers: Vec<io::Result<Vec<SocketAddr>>>) -> Scripted {
    let lookups = Arc::new(AtomicU64::new(0));
    let release = Arc::new(Semaphore::new(0));
    let answers: Arc<Vec<Result<Vec<SocketAddr>, String>>> =
        Arc::new(answers.into_iter().map(|answer| answer.map_err(|e| e.to_string())).collect());
    let (counted, released) = (Arc::clone(&lookups), Arc::clone(&release));
    let resolver = Resolver::with_lookup(Arc::new(move |_address: String| {
        let at = counted.fetch_add(1, Ordering::SeqCst) as usize;
        let answer = answers[at.min(answers.len() - 1)].clone();
        let released = Arc::clone(&released);
        Box::pin(async move {
            released.acquire().await.expect("open").forget();
            answer.map_err(io::Error::other)
        })
    }));
    Scripted { resolver, lookups, release }
}

fn at(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 2], port))
}

fn unknown() -> io::Error {
    io::Error::other("Temporary failure in name resolution")
}

#[tokio::test]
async fn a_literal_address_is_never_looked_up() {
    let scripted = scripted(vec![Ok(vec![at(1)])]);
    let found = scripted.resolver.resolve("10.0.0.9:4042").await.unwrap();
    assert_eq!(found, vec![SocketAddr::from(([10, 0, 0, 9], 4042))]);
    assert_eq!(scripted.lookups.load(Ordering::SeqCst), 0);
}

/// The case that starved brokers: many dials of a name whose lookup hangs start one lookup,
/// and all of them get its answer.
#[tokio::test]
async fn dials_of_a_hanging_name_share_one_lookup() {
    let scripted = Arc::new(scripted(vec![Err(unknown())]));
    let dials: Vec<_> = (0..50)
        .map(|_| {
            let scripted = Arc::clone(&scripted);
            tokio::spawn(async move { scripted.resolver.resolve("broker2:4042").await })
        })
        .collect();
    while scripted.lookups.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(scripted.lookups.load(Ordering::SeqCst), 1, "one lookup while it hangs");
    scripted.release.add_permits(1);
    for dial in dials {
        let error = dial.await.unwrap().unwrap_err().to_string();
        assert!(error.contains("resolving broker2:4042: Temporary failure"), "{error}");
    }
}

/// A name that resolved once is dialled at its last addresses at once, even while its next
/// lookup hangs or after it failed; a later answer replaces them.
#[tokio::test]
async fn the_last_addresses_serve_while_the_next_lookup_runs() {
    let scripted = scripted(vec![Ok(vec![at(1)]), Err(unknown()), Ok(vec![at(2)])]);
    let resolver = &scripted.resolver;
    scripted.release.add_permits(1);
    assert_eq!(resolver.resolve("broker2:4042").await.unwrap(), vec![at(1)]);
    // The second lookup (it will fail) hangs: dials go on at the first answer.
    for _ in 0..5 {
        assert_eq!(resolver.resolve("broker2:4042").await.unwrap(), vec![at(1)]);
    }
    assert_eq!(scripted.lookups.load(Ordering::SeqCst), 2);
    let mut answers = resolver.name("broker2:4042").answer.subscribe();
    scripted.release.add_permits(1);
    answers.changed().await.unwrap();
    assert!(answers.borrow().error.is_some(), "the failure is recorded");
    assert_eq!(resolver.resolve("broker2:4042").await.unwrap(), vec![at(1)], "kept");
    scripted.release.add_permits(1);
    answers.changed().await.unwrap();
    assert_eq!(resolver.resolve("broker2:4042").await.unwrap(), vec![at(2)], "replaced");
}

#[tokio::test]
async fn names_are_looked_up_apart() {
    let scripted = scripted(vec![Ok(vec![at(1)])]);
    scripted.release.add_permits(2);
    scripted.resolver.resolve("broker1:4042").await.unwrap();
    scripted.resolver.resolve("broker3:4042").await.unwrap();
    assert_eq!(scripted.lookups.load(Ordering::SeqCst), 2);
}

/// `known` never waits: nothing for a name until its lookup answered, then its addresses.
#[tokio::test]
async fn known_answers_at_once() {
    let scripted = scripted(vec![Ok(vec![at(1)])]);
    assert_eq!(
        scripted.resolver.known("10.0.0.9:1"),
        Some(vec![SocketAddr::from(([10, 0, 0, 9], 1))])
    );
    assert_eq!(scripted.resolver.known("broker2:4042"), None, "the lookup hangs");
    let mut answers = scripted.resolver.name("broker2:4042").answer.subscribe();
    scripted.release.add_permits(1);
    answers.changed().await.unwrap();
    assert_eq!(scripted.resolver.known("broker2:4042"), Some(vec![at(1)]));
    assert_eq!(scripted.lookups.load(Ordering::SeqCst), 2, "each call refreshes");
}

/// `last` reads what the previous lookup found and never starts one.
#[tokio::test]
async fn last_never_looks_up() {
    let scripted = scripted(vec![Ok(vec![at(1)]), Ok(vec![at(2)])]);
    assert_eq!(scripted.resolver.last("broker2:4042"), None);
    assert_eq!(scripted.lookups.load(Ordering::SeqCst), 0, "last started a lookup");
    let mut answers = scripted.resolver.name("broker2:4042").answer.subscribe();
    assert_eq!(scripted.resolver.known("broker2:4042"), None);
    scripted.release.add_permits(1);
    answers.changed().await.unwrap();
    for _ in 0..3 {
        assert_eq!(scripted.resolver.last("broker2:4042"), Some(vec![at(1)]));
    }
    assert_eq!(scripted.lookups.load(Ordering::SeqCst), 1, "only known looked up");
}
