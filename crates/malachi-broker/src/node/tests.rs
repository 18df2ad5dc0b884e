//! Boot: the data directory's modes, and the accounts a node seeds.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use malachi_log::{DIR_MODE, FILE_MODE, Record};

use crate::node::{Broker, NodeDeps};
use crate::produce::Spread;
use crate::testing;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every directory and file below `dir`.
fn walk(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut dirs, mut files) = (vec![dir.to_path_buf()], Vec::new());
    let mut at = 0;
    while at < dirs.len() {
        for entry in std::fs::read_dir(&dirs[at]).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() { dirs.push(path) } else { files.push(path) }
        }
        at += 1;
    }
    (dirs, files)
}

/// A data directory made loose by hand is made private at boot, and everything the broker
/// creates in it (the Raft store with the password hashes, the cursor secret, the admin
/// credentials, the journal, range directories, segments and their indexes) is private too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_and_everything_in_it_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let broker = testing::open(testing::config(&data_dir, &[])).await;
    broker.create_topic("orders", Some(2), None).await.unwrap();
    let records = (0..10).map(|at| Record::keyed(format!("k{at}"), Bytes::from("v"), 1));
    broker.produce("orders", records.collect(), &mut Spread::default()).await.unwrap();
    broker.shutdown().await;
    drop(broker);

    let (dirs, files) = walk(&data_dir);
    assert!(dirs.len() >= 3, "the data directory, topics and ranges: {dirs:?}");
    for path in &dirs {
        assert_eq!(mode(path), DIR_MODE, "{}", path.display());
    }
    let names: Vec<String> =
        files.iter().map(|path| path.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for expected in ["raft.redb", "cursor.secret", "admin.credentials", "journal"] {
        assert!(names.iter().any(|name| name == expected), "{expected} in {names:?}");
    }
    assert!(names.iter().any(|name| name.ends_with(".seg")), "segments in {names:?}");
    for path in &files {
        assert_eq!(mode(path), FILE_MODE, "{}", path.display());
    }
}

/// Every seeded password is held to `MALACHI_MIN_PASSWORD_LEN`: a short `MALACHI_DEFAULT_USERS`
/// one stops the boot, naming the user, before any account is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_seeded_password_stops_the_boot() {
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: &[Case] = &[
        (
            &[("DEFAULT_USERS", "ops:long-enough-pass:admin;app:app123:produce")],
            Some("MALACHI_DEFAULT_USERS: the password of user \"app\" has fewer than 12"),
        ),
        (
            &[("DEFAULT_USERS", "app:twelve-chars:produce"), ("MIN_PASSWORD_LEN", "13")],
            Some("MALACHI_DEFAULT_USERS: the password of user \"app\" has fewer than 13"),
        ),
        (&[("DEFAULT_USERS", "app:app123:produce"), ("MIN_PASSWORD_LEN", "6")], None),
        (&[("DEFAULT_USERS", "app:app123:produce"), ("DISABLE_DEFAULT_USERS", "true")], None),
    ];
    for (settings, refusal) in cases {
        let dir = tempfile::tempdir().unwrap();
        let deps = NodeDeps::production(testing::config(dir.path(), settings), 1);
        match (Broker::open(deps).await, refusal) {
            (Ok((broker, _)), None) => broker.shutdown().await,
            (Err(error), Some(expected)) => {
                let message = error.to_string();
                assert!(message.starts_with(expected), "{settings:?}: {message}");
                let created = dir.path().join("admin.credentials").exists();
                assert!(!created, "{settings:?}: nothing is created before the refusal");
            }
            (Ok(_), Some(expected)) => panic!("{settings:?} booted; expected {expected}"),
            (Err(error), None) => panic!("{settings:?} refused: {error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_passwords_are_held_to_the_minimum_before_hashing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = testing::open(testing::config(dir.path(), &[("MIN_PASSWORD_LEN", "16")])).await;
    let cases = [("fifteen-chars!!", false), ("sixteen-chars!!!", true)];
    for (password, accepted) in cases {
        let hashed = broker.admin().hash_new_password(password.to_string()).await;
        assert_eq!(hashed.is_ok(), accepted, "{password}");
        if let Ok(hash) = hashed {
            assert!(crate::auth::verify_password(Some(&hash), password));
        }
    }
    broker.shutdown().await;
}

/// Opens node 1 on `dir` with `settings`: the broker and the accounts its boot seeded.
async fn boot(dir: &Path, settings: &[(&str, &str)]) -> (std::sync::Arc<Broker>, Vec<String>) {
    let deps = NodeDeps::production(testing::config(dir, settings), 1);
    let (broker, report) = Broker::open(deps).await.expect("the broker opens");
    (broker, report.seeded_users)
}

/// Seeding happens once per name in the cluster's life: accounts an administrator deleted (the
/// bootstrap admin included) stay deleted across restarts, an account that existed before its
/// name was seeded is kept as it was, and a name added to `MALACHI_DEFAULT_USERS` later is
/// still created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_seeded_accounts_stay_deleted_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let exists = |broker: &Broker, name: &str| {
        broker.admin_group().read(|admin| admin.0.user(name).is_some())
    };
    let hash_of = |broker: &Broker, name: &str| {
        broker.admin_group().read(|admin| admin.0.user(name).map(|user| user.password_hash.clone()))
    };
    let (broker, seeded) = boot(dir.path(), &[]).await;
    assert!(seeded.is_empty() && exists(&broker, "admin"));
    let by_hand = malachi_meta::AdminCommand::CreateUser {
        username: "app".into(),
        password_hash: broker.admin().hash_new_password("made-by-hand-pass".into()).await.unwrap(),
        permissions: vec!["consume".into()],
        role: None,
    };
    broker.admin_group().propose(by_hand).await.unwrap().unwrap();
    let app_hash = hash_of(&broker, "app");
    broker.shutdown().await;
    drop(broker);

    let seeds = "ops:ops-password-long:admin;app:app-password-long:produce";
    let (broker, seeded) = boot(dir.path(), &[("DEFAULT_USERS", seeds)]).await;
    assert_eq!(seeded, ["ops"], "app existed and is kept as it was");
    assert_eq!(hash_of(&broker, "app"), app_hash);
    for name in ["admin", "app"] {
        let delete = malachi_meta::AdminCommand::DeleteUser { username: name.into() };
        broker.admin_group().propose(delete).await.unwrap().unwrap();
    }
    broker.shutdown().await;
    drop(broker);

    let later = format!("{seeds};late:late-password-long:consume");
    let (broker, seeded) = boot(dir.path(), &[("DEFAULT_USERS", later.as_str())]).await;
    assert_eq!(seeded, ["late"], "only the new name is seeded");
    let cases = [("admin", false), ("app", false), ("ops", true), ("late", true)];
    for (name, expected) in cases {
        assert_eq!(exists(&broker, name), expected, "{name} after the restart");
    }
    broker.shutdown().await;
}

/// Opens node 1 on `dir` with no `MALACHI_ADMIN_PASS`, so a first boot generates the password.
async fn boot_generated(dir: &Path) -> Result<(std::sync::Arc<Broker>, Option<String>), String> {
    let mut config = testing::config(dir, &[]);
    config.admin_pass = None;
    let opened = Broker::open(NodeDeps::production(config, 1)).await;
    let (broker, report) = opened.map_err(|error| error.to_string())?;
    Ok((broker, report.generated_admin_password))
}

/// The credentials file is written before the admin account is committed: a write that fails
/// stops the boot with no account created, so the next boot creates it, with a password the
/// file holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_credentials_write_creates_no_admin() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = crate::auth::admin_credentials_path(dir.path());
    std::fs::create_dir(&blocker).unwrap();
    let refused = boot_generated(dir.path()).await.unwrap_err();
    assert!(refused.contains(&dir.path().display().to_string()), "{refused}");

    std::fs::remove_dir(&blocker).unwrap();
    let (broker, generated) = boot_generated(dir.path()).await.unwrap();
    let password = generated.expect("the admin did not exist: it is created now");
    let stored = crate::auth::read_admin_credentials(dir.path()).unwrap();
    assert_eq!(stored, ("admin".to_string(), password.clone()));
    let hash =
        broker.admin_group().read(|admin| admin.0.user("admin").unwrap().password_hash.clone());
    assert!(crate::auth::verify_password(Some(&hash), &password));
    broker.shutdown().await;
}

/// A credentials file left by a boot that stopped before it committed the admin (or a link
/// planted at its name) is replaced, never read or followed; the new file is the admin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_admin_credentials_are_replaced() {
    for planted in ["stale file", "link"] {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let path = crate::auth::admin_credentials_path(dir.path());
        match planted {
            "link" => std::os::unix::fs::symlink(&victim, &path).unwrap(),
            _ => crate::auth::write_admin_credentials(dir.path(), "admin", "never-worked").unwrap(),
        }
        let (broker, generated) = boot_generated(dir.path()).await.unwrap();
        let password = generated.expect("first boot");
        let stored = crate::auth::read_admin_credentials(dir.path()).unwrap();
        assert_eq!(stored, ("admin".to_string(), password), "{planted}");
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink(), "{planted}");
        assert_eq!(mode(&path), FILE_MODE, "{planted}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched", "{planted}");
        broker.shutdown().await;
    }
}
