//! Argon2 for logins, on threads of its own with a bounded queue: a flood of logins (or of
//! strangers guessing) must neither take the blocking pool that runs `fdatasync` for produce
//! nor queue without end. A login that finds the queue full is answered `overloaded`
//! (retryable), before any Argon2 work.
//!
//! Under the simulator (`IoMode::Inline`) the check runs on the calling task, like storage.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use malachi_broker::auth::verify_password;
use malachi_broker::data::IoMode;
use malachi_wire::Reason;

/// Threads that run Argon2 (each check takes tens of milliseconds of one core).
pub const PASSWORD_THREADS: usize = 2;
/// Checks waiting for a thread; one more is refused `overloaded`.
pub const PASSWORD_QUEUE_MAX: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

/// The server's Argon2 pool; its threads start with the first check and end with the pool.
#[derive(Debug)]
pub struct PasswordPool {
    io_mode: IoMode,
    queue: Mutex<Option<SyncSender<Job>>>,
}

impl PasswordPool {
    pub fn new(io_mode: IoMode) -> PasswordPool {
        PasswordPool { io_mode, queue: Mutex::new(None) }
    }

    /// Whether `password` matches `hash` (a missing user costs the same work); `overloaded`
    /// when the queue is full.
    pub async fn verify(&self, hash: Option<String>, password: String) -> Result<bool, Reason> {
        if self.io_mode == IoMode::Inline {
            return Ok(verify_password(hash.as_deref(), &password));
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = answer.send(verify_password(hash.as_deref(), &password));
        });
        match self.sender().try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                return Err(Reason::Overloaded);
            }
        }
        answered.await.map_err(|_| Reason::Overloaded)
    }

    fn sender(&self) -> SyncSender<Job> {
        let mut queue = self.queue.lock().expect("password pool lock poisoned");
        queue.get_or_insert_with(start_threads).clone()
    }
}

fn start_threads() -> SyncSender<Job> {
    let (sender, receiver) = sync_channel::<Job>(PASSWORD_QUEUE_MAX);
    let receiver = Arc::new(Mutex::new(receiver));
    for index in 0..PASSWORD_THREADS {
        let receiver = Arc::clone(&receiver);
        std::thread::Builder::new()
            .name(format!("malachi-argon2-{index}"))
            .spawn(move || run_jobs(&receiver))
            .expect("an Argon2 thread starts");
    }
    sender
}

/// Runs checks until the pool is dropped.
fn run_jobs(receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = receiver.lock().expect("password queue lock poisoned").recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More checks than threads and queue together: some are refused `overloaded` at once,
    /// the rest all answer, and right ones match.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_beyond_the_queue_is_refused_and_the_rest_answered() {
        let hash =
            malachi_broker::auth::hash_password("correct horse", &malachi_broker::auth::OsEntropy);
        let pool = Arc::new(PasswordPool::new(IoMode::Threads));
        let checks: Vec<_> = (0..PASSWORD_QUEUE_MAX + 40)
            .map(|at| {
                let pool = Arc::clone(&pool);
                let hash = hash.clone();
                let password = if at % 2 == 0 { "correct horse" } else { "wrong" };
                tokio::spawn(async move { (at, pool.verify(Some(hash), password.into()).await) })
            })
            .collect();
        let mut refused = 0;
        for check in checks {
            match check.await.unwrap() {
                (_, Err(reason)) => {
                    assert_eq!(reason, Reason::Overloaded);
                    refused += 1;
                }
                (at, Ok(matched)) => assert_eq!(matched, at % 2 == 0, "check {at}"),
            }
        }
        assert!(
            refused > 0,
            "{} checks never filled a queue of {PASSWORD_QUEUE_MAX}",
            PASSWORD_QUEUE_MAX + 40
        );
        assert!(pool.verify(Some(hash), "correct horse".into()).await.unwrap(), "usable after");
    }
}
