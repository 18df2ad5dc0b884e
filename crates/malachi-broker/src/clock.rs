//! Where wall-clock time enters the broker: decision code takes a [`Clock`] and never reads a
//! clock itself, so the simulator can hand it a simulated one.

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
