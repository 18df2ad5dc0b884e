//! A watch channel whose wake-ups happen in one reproducible order.
//!
//! tokio's `watch` spreads its waiters over eight `Notify`s picked with the runtime's random
//! generator, which cannot be seeded on stable tokio: two tasks waiting on one channel then wake
//! in an order that differs from run to run, and a simulated run stops replaying. This one keeps
//! every waiter on a single `Notify`. It serves openraft (through [`crate::MalachiRuntime`]) and
//! the broker's long-poll signals.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::Notify;

struct Shared<T> {
    value: RwLock<T>,
    /// Bumped by every change; a receiver has seen the versions up to its own `seen`.
    version: AtomicU64,
    senders: AtomicUsize,
    receivers: AtomicUsize,
    notify: Notify,
}

impl<T> Shared<T> {
    fn read(&self) -> RwLockReadGuard<'_, T> {
        self.value.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.value.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Every sender is gone: no value will change again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the watch channel's senders are gone")]
pub struct Closed;

pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
}

/// A channel holding `init`; the receiver has seen it.
pub fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        value: RwLock::new(init),
        version: AtomicU64::new(0),
        senders: AtomicUsize::new(1),
        receivers: AtomicUsize::new(1),
        notify: Notify::new(),
    });
    (Sender { shared: Arc::clone(&shared) }, Receiver { shared, seen: 0 })
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("watch::Sender")
            .field("version", &self.shared.version.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("watch::Receiver").field("seen", &self.seen).finish_non_exhaustive()
    }
}

impl<T> Sender<T> {
    /// Replaces the value; refused (the value handed back) when no receiver is left.
    pub fn send(&self, value: T) -> Result<(), T> {
        if self.shared.receivers.load(Ordering::SeqCst) == 0 {
            return Err(value);
        }
        *self.shared.write() = value;
        self.changed();
        Ok(())
    }

    /// Lets `modify` change the value in place; receivers hear of it when it returns true.
    pub fn send_if_modified(&self, modify: impl FnOnce(&mut T) -> bool) -> bool {
        let modified = modify(&mut self.shared.write());
        if modified {
            self.changed();
        }
        modified
    }

    pub fn send_modify(&self, modify: impl FnOnce(&mut T)) {
        self.send_if_modified(|value| {
            modify(value);
            true
        });
    }

    pub fn borrow(&self) -> RwLockReadGuard<'_, T> {
        self.shared.read()
    }

    /// A receiver that has seen the current value.
    pub fn subscribe(&self) -> Receiver<T> {
        self.shared.receivers.fetch_add(1, Ordering::SeqCst);
        Receiver {
            shared: Arc::clone(&self.shared),
            seen: self.shared.version.load(Ordering::SeqCst),
        }
    }

    fn changed(&self) {
        self.shared.version.fetch_add(1, Ordering::SeqCst);
        self.shared.notify.notify_waiters();
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::SeqCst);
        Sender { shared: Arc::clone(&self.shared) }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.notify.notify_waiters();
        }
    }
}

impl<T> Receiver<T> {
    /// Waits for a value this receiver has not seen; `Err` once every sender is gone and every
    /// change was seen.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            // Registered before the checks, so a change between them still wakes us.
            notified.as_mut().enable();
            let version = self.shared.version.load(Ordering::SeqCst);
            if version != self.seen {
                self.seen = version;
                return Ok(());
            }
            if self.shared.senders.load(Ordering::SeqCst) == 0 {
                return Err(Closed);
            }
            notified.await;
        }
    }

    /// Whether a value arrived that this receiver has not seen.
    pub fn has_changed(&self) -> bool {
        self.shared.version.load(Ordering::SeqCst) != self.seen
    }

    pub fn borrow(&self) -> RwLockReadGuard<'_, T> {
        self.shared.read()
    }

    /// The value, now marked seen.
    pub fn borrow_and_update(&mut self) -> RwLockReadGuard<'_, T> {
        self.seen = self.shared.version.load(Ordering::SeqCst);
        self.shared.read()
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.shared.receivers.fetch_add(1, Ordering::SeqCst);
        Receiver { shared: Arc::clone(&self.shared), seen: self.seen }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.receivers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// openraft's view of this channel: [`crate::MalachiRuntime`]'s `Watch`.
pub struct MalachiWatch;

mod openraft_glue {
    use openraft::rt::watch as rt;
    use openraft::{OptionalSend, OptionalSync};

    use super::{MalachiWatch, Receiver, Sender, channel};

    impl rt::Watch for MalachiWatch {
        type Sender<T: OptionalSend + OptionalSync> = Sender<T>;
        type Receiver<T: OptionalSend + OptionalSync> = Receiver<T>;
        type Ref<'a, T: OptionalSend + 'a> = std::sync::RwLockReadGuard<'a, T>;

        fn channel<T: OptionalSend + OptionalSync>(init: T) -> (Sender<T>, Receiver<T>) {
            channel(init)
        }
    }

    impl<T: OptionalSend + OptionalSync> rt::WatchSender<MalachiWatch, T> for Sender<T> {
        fn send(&self, value: T) -> Result<(), rt::SendError<T>> {
            Sender::send(self, value).map_err(rt::SendError)
        }

        fn send_if_modified<F>(&self, modify: F) -> bool
        where
            F: FnOnce(&mut T) -> bool,
        {
            Sender::send_if_modified(self, modify)
        }

        fn borrow_watched(&self) -> std::sync::RwLockReadGuard<'_, T> {
            self.borrow()
        }

        fn subscribe(&self) -> Receiver<T> {
            Sender::subscribe(self)
        }
    }

    impl<T: OptionalSend + OptionalSync> rt::WatchReceiver<MalachiWatch, T> for Receiver<T> {
        async fn changed(&mut self) -> Result<(), rt::RecvError> {
            Receiver::changed(self).await.map_err(|_| rt::RecvError(()))
        }

        fn borrow_watched(&self) -> std::sync::RwLockReadGuard<'_, T> {
            self.borrow()
        }

        fn borrow_and_update(&mut self) -> std::sync::RwLockReadGuard<'_, T> {
            Receiver::borrow_and_update(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn receivers_see_each_change_once_and_the_close() {
        let (sender, mut first) = channel(0u64);
        let mut second = sender.subscribe();
        assert!(!first.has_changed());
        sender.send_modify(|value| *value += 1);
        first.changed().await.unwrap();
        assert_eq!(*first.borrow(), 1);
        assert!(!first.has_changed(), "seen once");
        second.changed().await.unwrap();
        let waiter = tokio::spawn(async move { first.changed().await });
        tokio::task::yield_now().await;
        drop(sender);
        assert_eq!(waiter.await.unwrap(), Err(Closed), "a dropped sender ends the wait");
        assert_eq!(second.changed().await, Err(Closed));
    }

    #[tokio::test]
    async fn send_without_receivers_is_refused() {
        let (sender, receiver) = channel(1u8);
        drop(receiver);
        assert_eq!(sender.send(2), Err(2));
    }
}
