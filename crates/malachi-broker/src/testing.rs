//! A broker on real files for tests in this and other crates: configuration from a table of
//! settings, real storage, the system clock and the OS's randomness.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::{BrokerConfig, Sources};
use crate::node::{Broker, NodeDeps};

/// The bootstrap admin password tests use.
pub const ADMIN_PASSWORD: &str = "admin-password-long";

/// A configuration with its data in `data_dir`, the admin password above, and `settings`
/// (setting names without the `MALACHI_` prefix) taking precedence; the environment is ignored.
pub fn config(data_dir: &Path, settings: &[(&str, &str)]) -> BrokerConfig {
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    flags.insert("LOG_DATA_DIR".into(), data_dir.display().to_string());
    flags.insert("ADMIN_PASS".into(), ADMIN_PASSWORD.into());
    // A small journal: fast to create, and checkpoints happen often.
    flags.insert("JOURNAL_BYTES".into(), "2097152".into());
    for (name, value) in settings {
        flags.insert(name.to_string(), value.to_string());
    }
    let no_env = |_: &str| None;
    BrokerConfig::load(&Sources { flags: &flags, env: &no_env, file: &BTreeMap::new() })
        .expect("test settings are valid")
}

/// Opens node 1 on real files.
pub async fn open(config: BrokerConfig) -> Arc<Broker> {
    let deps = NodeDeps::production(config, 1);
    Broker::open(deps).await.expect("the test broker opens").0
}

/// Waits until `done` holds, looking every millisecond: tests synchronise on state, not on
/// sleeps. Panics after 20 s, a bound on liveness rather than a measure of speed.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..20_000 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("timed out waiting until {what}");
}
