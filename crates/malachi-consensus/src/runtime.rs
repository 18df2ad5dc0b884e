//! The async runtime openraft runs on: tokio, except that its randomness (election timeouts,
//! tick jitter) comes from a per-thread SplitMix64 stream that the simulator can seed.
//!
//! openraft's stock tokio runtime draws from `rand::rng()`, which is seeded by the OS: one
//! election timeout drawn differently and a whole simulated run diverges. Its watch channel is
//! ours too ([`crate::watch`]), since tokio's wakes waiters in a random order. Everything else
//! delegates to `openraft_rt_tokio::TokioRuntime`, so timers still come from tokio's clock
//! (which the simulator pauses and advances).

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend};
use openraft_rt_tokio::TokioRuntime;

thread_local! {
    /// The state of this thread's stream; `None` until first use or until seeded.
    static STREAM_STATE: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Makes every later draw of openraft's randomness on this thread a function of `seed`. The
/// simulator calls it before it starts a node; production never does (the stream is then
/// seeded from the OS on first use).
pub fn seed_raft_rng(seed: u64) {
    STREAM_STATE.with(|state| state.set(Some(seed)));
}

/// One step of SplitMix64: advances `state` and returns the next output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_133f_11eb);
    z ^ (z >> 31)
}

fn os_seed() -> u64 {
    let mut bytes = [0u8; 8];
    // Without OS randomness every node would draw the same election timeouts, which costs
    // elections but not safety; a fixed fallback is the honest degradation.
    if getrandom::fill(&mut bytes).is_err() {
        return 0x5eed;
    }
    u64::from_le_bytes(bytes)
}

/// The generator openraft gets from [`MalachiRuntime::thread_rng`]: a fresh SplitMix64 whose
/// seed is the next output of this thread's stream.
#[derive(Debug)]
pub struct RaftRng {
    state: u64,
}

impl RaftRng {
    fn next_from_thread() -> RaftRng {
        STREAM_STATE.with(|cell| {
            let mut state = cell.get().unwrap_or_else(os_seed);
            let seed = splitmix64(&mut state);
            cell.set(Some(state));
            RaftRng { state: seed }
        })
    }
}

impl rand_core::TryRng for RaftRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((splitmix64(&mut self.state) >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(splitmix64(&mut self.state))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let word = splitmix64(&mut self.state).to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}

/// Tokio with a seedable random stream; see the module documentation.
#[derive(Debug)]
pub struct MalachiRuntime {
    inner: TokioRuntime,
}

impl AsyncRuntime for MalachiRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = RaftRng;
    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    /// Not tokio's: see [`crate::watch`].
    type Watch = crate::watch::MalachiWatch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        RaftRng::next_from_thread()
    }

    fn new(threads: usize) -> Self {
        MalachiRuntime { inner: TokioRuntime::new(threads) }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.inner.block_on(future)
    }
}

#[cfg(test)]
mod tests {
    use rand_core::Rng;

    use super::*;

    /// openraft's own conformance suite for runtimes (channels, watch, timers, RNG).
    #[test]
    fn the_runtime_passes_openrafts_suite() {
        openraft::rt::testing::Suite::<MalachiRuntime>::test_all();
    }

    #[test]
    fn a_seeded_thread_draws_the_same_stream_twice() {
        let draw = |seed| {
            seed_raft_rng(seed);
            (0..4).map(|_| MalachiRuntime::thread_rng().next_u64()).collect::<Vec<_>>()
        };
        let first = draw(7);
        assert_eq!(first, draw(7));
        assert_ne!(first, draw(8));
        // Successive generators of one stream differ from each other.
        assert_ne!(first[0], first[1]);
    }
}
