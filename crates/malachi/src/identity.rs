//! Who this broker is: its node id and its cluster's id, recorded in the data directory at first
//! boot (`<data dir>/identity`) and never changed after. Raft remembers voters by node id, so a
//! data directory started once as node 1 must never come back as node 7: `--node-id` (or
//! `MALACHI_NODE_ID`) may choose the id of a new directory, and must agree with the recorded one
//! afterwards.
//!
//! A directory from before this file existed holds a Raft store (`raft.redb`) written as node 1,
//! the only id a single broker ever used: it is recorded as node 1.
//!
//! The Raft store is created before the identity is recorded, so a directory with an identity
//! and no Raft store lost it (a file deleted, a volume restored without it). Such a broker is
//! refused: it would come back with every vote and metadata entry it promised forgotten, and a
//! voter that forgot its votes can elect a second leader in a term.

use std::io::Write;
use std::path::{Path, PathBuf};

use malachi_broker::auth::{Entropy, OsEntropy};

/// The identity file's name in the data directory.
pub const IDENTITY_FILE: &str = "identity";
/// The Raft store's name in the data directory (`malachi_broker::node` opens it).
pub const RAFT_STORE_FILE: &str = "raft.redb";
/// The identity file's format. A file without `format` is version 1 (the first release wrote
/// none); a later version is refused by name, so an older release never misreads a newer file.
pub const IDENTITY_FORMAT: i64 = 1;
/// The id a broker takes when nothing chooses one (and the one every older directory used).
pub const DEFAULT_NODE_ID: u64 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIdentity {
    pub node_id: u64,
    /// 32 hexadecimal digits, drawn at the cluster's first boot.
    pub cluster_id: String,
}

/// Why the broker cannot know who it is.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "{path} records node {recorded}, but node {requested} was asked for (--node-id or \
         MALACHI_NODE_ID): a data directory keeps the node id it was first started with"
    )]
    Mismatch { path: PathBuf, recorded: u64, requested: u64 },
    #[error(
        "{path} holds the Raft state of node {DEFAULT_NODE_ID} (written before node ids were \
         recorded), but node {requested} was asked for"
    )]
    OlderDirectory { path: PathBuf, requested: u64 },
    #[error(
        "{raft} is missing, but {identity} records that this directory was started as node \
         {node_id}: its Raft state (the votes it cast, the metadata it stored) is lost, and a \
         broker that forgot its votes can break the cluster's agreement, so it does not start. \
         To bring this host back, remove the broker through another one (`malachi cluster \
         remove {node_id} --force`), empty this data directory and start it as a new broker \
         with an unused --node-id; alone, restore the directory from a backup"
    )]
    RaftStoreLost { raft: PathBuf, identity: PathBuf, node_id: u64 },
    #[error("node id 0 is reserved; choose 1 or more")]
    ZeroNodeId,
    #[error("{path}: {problem}")]
    Damaged { path: PathBuf, problem: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Reads the identity recorded in `data_dir`, or records one: `requested` or
/// [`DEFAULT_NODE_ID`], and a new cluster id. The file is written to a temporary name, synced,
/// renamed and its directory synced, so a crash leaves either no identity or a whole one.
///
/// `joining` is the cluster id a new directory records instead of a new one: the cluster this
/// broker is joining, as its seed told it.
pub fn load_or_create(
    data_dir: &Path,
    joining: Option<&str>,
    requested: Option<u64>,
) -> Result<NodeIdentity, IdentityError> {
    if requested == Some(0) {
        return Err(IdentityError::ZeroNodeId);
    }
    let path = data_dir.join(IDENTITY_FILE);
    let io = |source| IdentityError::Io { path: path.clone(), source };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let identity = parse(&text)
                .map_err(|problem| IdentityError::Damaged { path: path.clone(), problem })?;
            if let Some(requested) = requested.filter(|requested| *requested != identity.node_id) {
                return Err(IdentityError::Mismatch {
                    path,
                    recorded: identity.node_id,
                    requested,
                });
            }
            let raft = data_dir.join(RAFT_STORE_FILE);
            if !raft.try_exists().map_err(io)? {
                let node_id = identity.node_id;
                return Err(IdentityError::RaftStoreLost { raft, identity: path, node_id });
            }
            Ok(identity)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let raft = data_dir.join(RAFT_STORE_FILE);
            let older = raft.try_exists().map_err(io)?;
            let node_id = match requested {
                Some(requested) if older && requested != DEFAULT_NODE_ID => {
                    return Err(IdentityError::OlderDirectory { path: raft, requested });
                }
                Some(requested) => requested,
                None => DEFAULT_NODE_ID,
            };
            let cluster_id = match joining {
                Some(cluster_id) if is_cluster_id(cluster_id) => cluster_id.to_string(),
                Some(other) => {
                    let problem = format!("the seed's cluster id {other:?} is not 32 hex digits");
                    return Err(IdentityError::Damaged { path, problem });
                }
                None => {
                    let mut bytes = [0u8; 16];
                    OsEntropy.fill(&mut bytes);
                    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
                }
            };
            let identity = NodeIdentity { node_id, cluster_id };
            let storage = malachi_log::storage::RealStorage;
            malachi_broker::node::create_data_dir(&storage, data_dir).map_err(io)?;
            if !older {
                // Before the identity: an identity without a store then means the store was lost.
                malachi_consensus::GroupStore::open(&raft).map_err(|error| IdentityError::Io {
                    path: raft.clone(),
                    source: std::io::Error::other(error.to_string()),
                })?;
            }
            write_durably(data_dir, &path, &format(&identity)).map_err(io)?;
            Ok(identity)
        }
        Err(error) => Err(io(error)),
    }
}

fn format(identity: &NodeIdentity) -> String {
    format!(
        "# This broker's identity, recorded at its first boot. Do not edit or copy it.\n\
         format = {IDENTITY_FORMAT}\nnode_id = {}\ncluster_id = \"{}\"\n",
        identity.node_id, identity.cluster_id
    )
}

fn parse(text: &str) -> Result<NodeIdentity, String> {
    let table: toml::Table = text.parse().map_err(|error| format!("not TOML: {error}"))?;
    match table.get("format").map(toml::Value::as_integer) {
        None | Some(Some(IDENTITY_FORMAT)) => {}
        Some(Some(newer)) if newer > IDENTITY_FORMAT => {
            return Err(format!(
                "format {newer}, and this release reads format {IDENTITY_FORMAT}: the directory \
                 was written by a newer release, which must open it"
            ));
        }
        Some(_) => return Err(format!("format is not a version of 1 to {IDENTITY_FORMAT}")),
    }
    let node_id = table
        .get("node_id")
        .and_then(toml::Value::as_integer)
        .and_then(|id| u64::try_from(id).ok())
        .filter(|id| *id > 0)
        .ok_or("no node_id of 1 or more")?;
    let cluster_id = table
        .get("cluster_id")
        .and_then(toml::Value::as_str)
        .filter(|id| is_cluster_id(id))
        .ok_or("no cluster_id of 32 hexadecimal digits")?
        .to_string();
    Ok(NodeIdentity { node_id, cluster_id })
}

fn is_cluster_id(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// Whether `data_dir` has an identity already (it is not a broker's first boot).
pub fn exists(data_dir: &Path) -> bool {
    data_dir.join(IDENTITY_FILE).exists()
}

fn write_durably(dir: &Path, path: &Path, text: &str) -> std::io::Result<()> {
    let temporary = dir.join(format!("{IDENTITY_FILE}.new"));
    // Private like the rest of the data directory (0600), whatever the umask.
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?
    };
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_boot_records_an_identity_that_later_boots_keep() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), None, Some(7)).unwrap();
        assert_eq!(first.node_id, 7);
        assert!(parse(&format(&first)).is_ok(), "{first:?}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(IDENTITY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the identity file is private");
        let cases = [(None, Ok(7)), (Some(7), Ok(7)), (Some(8), Err("records node 7"))];
        for (requested, expected) in cases {
            let loaded = load_or_create(dir.path(), None, requested);
            match (loaded, expected) {
                (Ok(identity), Ok(node_id)) => {
                    let cluster_id = first.cluster_id.clone();
                    assert_eq!(identity, NodeIdentity { node_id, cluster_id }, "kept as recorded");
                }
                (Err(error), Err(text)) => assert!(error.to_string().contains(text), "{error}"),
                (loaded, expected) => panic!("{requested:?}: {loaded:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn a_joining_broker_records_its_seeds_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = "0123456789abcdef0123456789abcdef";
        assert!(!exists(dir.path()));
        let identity = load_or_create(dir.path(), Some(cluster), Some(2)).unwrap();
        assert_eq!(identity, NodeIdentity { node_id: 2, cluster_id: cluster.into() });
        assert!(exists(dir.path()));
        let other = tempfile::tempdir().unwrap();
        let refused = load_or_create(other.path(), Some("not-a-cluster"), Some(2)).unwrap_err();
        assert!(refused.to_string().contains("not 32 hex digits"), "{refused}");
    }

    /// The first boot creates the Raft store before the identity; a later boot that finds the
    /// identity without the store refuses by name, and says what to do.
    #[test]
    fn a_lost_raft_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let identity = load_or_create(dir.path(), None, Some(3)).unwrap();
        let raft = dir.path().join(RAFT_STORE_FILE);
        assert!(raft.exists(), "the first boot created the Raft store");
        assert_eq!(load_or_create(dir.path(), None, None).unwrap(), identity);
        std::fs::remove_file(&raft).unwrap();
        let refused = load_or_create(dir.path(), None, None).unwrap_err();
        assert!(matches!(refused, IdentityError::RaftStoreLost { node_id: 3, .. }), "{refused}");
        let text = refused.to_string();
        for expected in ["raft.redb is missing", "node 3", "malachi cluster remove 3 --force"] {
            assert!(text.contains(expected), "{expected:?} in {text}");
        }
        assert!(!raft.exists(), "a refused boot creates nothing");
    }

    #[test]
    fn a_directory_from_before_identities_is_node_1() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("raft.redb"), b"raft state").unwrap();
        let refused = load_or_create(dir.path(), None, Some(7)).unwrap_err();
        assert!(matches!(refused, IdentityError::OlderDirectory { requested: 7, .. }), "{refused}");
        assert_eq!(load_or_create(dir.path(), None, None).unwrap().node_id, 1);
    }

    #[test]
    fn zero_and_damaged_identities_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            load_or_create(dir.path(), None, Some(0)),
            Err(IdentityError::ZeroNodeId)
        ));
        let cases = [
            ("node_id = 0\ncluster_id = \"00000000000000000000000000000000\"\n", "no node_id"),
            ("node_id = 3\ncluster_id = \"xyz\"\n", "no cluster_id"),
            ("node_id = = 3", "not TOML"),
            (
                "format = 2\nnode_id = 3\ncluster_id = \"00000000000000000000000000000000\"\n",
                "format 2",
            ),
            ("format = \"one\"\nnode_id = 3\n", "format is not a version"),
        ];
        for (text, problem) in cases {
            std::fs::write(dir.path().join(IDENTITY_FILE), text).unwrap();
            let error = load_or_create(dir.path(), None, None).unwrap_err();
            assert!(error.to_string().contains(problem), "{text:?}: {error}");
        }
    }
}
