//! Broker settings: the original system's `MALACHI_*` names and defaults, resolved as
//! flag > environment > TOML file > default. A malformed value stops the broker at boot with a
//! message naming the variable. `docs/configuration.md` lists every setting.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;

use crate::load::LoadConfig;

mod security;
pub use security::{
    MtlsConfig, MtlsPolicy, OIDC_ALGORITHMS, OidcConfig, SecurityConfig, TlsConfig, TlsVerify,
};

/// Every setting the broker reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerConfig {
    pub bind_address: String,
    pub tcp_port: u16,
    pub max_frame_bytes: u32,
    pub auth_timeout_ms: u64,
    pub tcp_recv_timeout_ms: u64,
    pub tcp_send_timeout_ms: u64,
    pub shutdown_grace_ms: u64,
    /// On SIGTERM, how long handing the work over and closing may take in all before the
    /// broker exits at once (`MALACHI_SHUTDOWN_TIMEOUT_MS`).
    pub shutdown_timeout_ms: u64,
    pub connection_limit_enabled: bool,
    pub max_conn_per_ip: u32,
    pub max_total_conn: u32,
    /// Connections not yet logged in, at once (ours).
    pub max_unauthenticated_conn: u32,
    pub data_dir: PathBuf,
    pub segment_max_bytes: u64,
    pub segment_max_age_ms: u64,
    pub group_commit_linger_us: u64,
    pub group_commit_max_records: u32,
    pub group_commit_max_bytes: u64,
    /// How a group-commit round that wrote several segments makes them durable.
    pub group_commit_barrier: crate::data::Barrier,
    /// Size of the node journal file, preallocated at first boot.
    pub journal_bytes: u64,
    pub retention_max_age_ms: Option<u64>,
    pub retention_max_bytes: Option<u64>,
    pub retention_interval_ms: u64,
    pub retention_unresolved_policy_max_age_ms: Option<u64>,
    pub admin_pass: Option<String>,
    pub default_users: Option<String>,
    pub disable_default_users: bool,
    pub min_password_len: u32,
    pub acl_strict: bool,
    pub rate_limit_enabled: bool,
    pub auth_rate_limit: u32,
    pub auth_rate_window_ms: u64,
    pub max_auth_attempts: u32,
    pub lockout_duration_ms: u64,
    pub progressive_lockout: bool,
    pub load: LoadConfig,
    /// Segment files kept open at once; idle ones beyond it close and reopen on use.
    pub max_open_segments: u32,
    /// Live topics in all.
    pub max_topics: u32,
    /// Active ranges over all topics (each holds a write head open on a broker).
    pub max_active_ranges: u32,
    /// Live topics one non-administrator may have created.
    pub max_topics_per_user: u32,
    /// How long a consumer group member may stay silent (no fetch, heartbeat or commit) before
    /// the group drops it and hands its ranges to the others (`MALACHI_GROUP_SESSION_TIMEOUT_MS`,
    /// ours; the original's fixed 30 s).
    pub group_session_timeout_ms: u64,
    /// The node id a new data directory records (`MALACHI_NODE_ID`); an existing one keeps its
    /// own, and must agree with this if set.
    pub node_id: Option<u64>,
    /// This broker's placement attributes (`MALACHI_LOG_ATTRIBUTES`, `rack=a,zone=eu-1`).
    pub attributes: BTreeMap<String, String>,
    /// TLS, certificate and token logins, per-user quotas.
    pub security: SecurityConfig,
    /// The HTTP port: health, readiness, metrics and the console.
    pub dashboard: DashboardConfig,
    /// How this broker meets the others.
    pub cluster: ClusterConfig,
}

/// The cluster settings: where peers reach this broker, and whom to join.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Whether this broker is a member of a cluster: `MALACHI_CLUSTER_PORT` or
    /// `MALACHI_LOG_NODES` is set. Otherwise it is alone and opens no inter-node port.
    pub enabled: bool,
    /// The inter-node port (`MALACHI_CLUSTER_PORT`), on the cluster bind address.
    pub port: u16,
    /// Where the inter-node and gossip ports listen (`MALACHI_CLUSTER_BIND_ADDRESS`; default
    /// the client bind address), so they can stay on a private network.
    pub bind_address: String,
    /// How the inter-node port is secured (docs/security.md).
    pub security: ClusterSecurity,
    /// The host peers and clients should use for this broker (`MALACHI_ADVERTISE_HOST`;
    /// default the bind address).
    pub advertise_host: String,
    /// The SWIM membership port, UDP (`MALACHI_CLUSTER_GOSSIP_PORT`), on the bind address.
    pub gossip_port: u16,
    /// Inter-node addresses of brokers to join through (`MALACHI_LOG_NODES`, `host:port`
    /// separated by commas). Empty: this broker starts a cluster of its own.
    pub seeds: Vec<String>,
    /// Vnodes of the ring a cluster created by this broker gets (`MALACHI_LOG_VNODES`): each
    /// is a Raft group of topic metadata with a leader that coordinates its topics. Fixed when
    /// the cluster (or a broker alone) first starts.
    pub vnodes: u32,
    /// Voters of each vnode's Raft group (`MALACHI_LOG_VNODE_REPLICATION_FACTOR`).
    pub vnode_voters: usize,
    /// How long a voter's broker may be dead before its seat moves to a live broker
    /// (`MALACHI_VOTER_REPLACE_AFTER_MS`, ours).
    pub voter_replace_after_ms: u64,
    /// Replicas of each new segment (`MALACHI_LOG_REPLICATION_FACTOR`, 3): at most the live
    /// brokers, so a broker alone keeps one.
    pub replication_factor: usize,
    /// The spread of segment replicas over fault domains (`MALACHI_LOG_SPREAD_BY`,
    /// `_MIN_DOMAINS`, `_MAX_SKEW`, `_PLACEMENT_POLICY`).
    pub placement: malachi_meta::placement::Constraints,
    /// How long an append waits for a quorum of its segment's replicas before it is refused
    /// `no_quorum` (`MALACHI_REPLICATION_TIMEOUT_MS`, ours).
    pub replication_timeout_ms: u64,
    /// How long a broker holding a replica of a sealed segment may be dead before healing
    /// moves the replica to another broker (`MALACHI_REPLICA_REPLACE_AFTER_MS`, ours).
    pub replica_replace_after_ms: u64,
    /// Bytes of one span a primary reads from its file for a follower catching up
    /// (`MALACHI_REPLICATION_CATCH_UP_BYTES`, ours; at least one record is read).
    pub replication_catch_up_bytes: u64,
    /// Bytes of batches a primary holds in memory per segment for followers that lack them
    /// (`MALACHI_REPLICATION_HELD_BYTES_MAX`, ours): past it a slow follower is shipped from
    /// the file.
    pub replication_held_bytes_max: u64,
    /// The integrity scrub of sealed copies (`MALACHI_SCRUB_ENABLED`, `_INTERVAL_MS`,
    /// `_SEGMENTS_PER_TICK`).
    pub scrub: ScrubConfig,
}

/// How brokers authenticate each other and encrypt their traffic.
#[derive(Clone, PartialEq, Eq)]
pub enum ClusterSecurity {
    /// TLS 1.3 with certificates of the cluster's own CA: made by the broker that creates the
    /// cluster, handed to each joiner that proves it knows the join token (the default).
    /// `token` is `MALACHI_CLUSTER_TOKEN`: unset, the creator generates one and a joiner has
    /// none (and so cannot join).
    Managed { token: Option<String> },
    /// TLS 1.3 with the operator's CA and this broker's certificate
    /// (`MALACHI_CLUSTER_TLS_CACERTFILE`, `_CERTFILE`, `_KEYFILE`; the certificate names the
    /// node as `node-<id>.malachi.internal`). Such a broker admits nobody by enrollment.
    Provided { ca_file: PathBuf, cert_file: PathBuf, key_file: PathBuf },
    /// Plain TCP, peers believed on their word (`MALACHI_CLUSTER_INSECURE=true`).
    Insecure,
}

impl std::fmt::Debug for ClusterSecurity {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterSecurity::Managed { token } => formatter
                .debug_struct("Managed")
                .field("token", &token.as_ref().map(|_| "<secret>"))
                .finish(),
            ClusterSecurity::Provided { ca_file, cert_file, key_file } => formatter
                .debug_struct("Provided")
                .field("ca_file", ca_file)
                .field("cert_file", cert_file)
                .field("key_file", key_file)
                .finish(),
            ClusterSecurity::Insecure => formatter.write_str("Insecure"),
        }
    }
}

/// How often each broker re-verifies the sealed copies it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubConfig {
    pub enabled: bool,
    pub interval_ms: u64,
    pub segments_per_tick: u32,
}

impl ClusterConfig {
    /// The inter-node address peers dial.
    pub fn advertised_cluster_address(&self) -> String {
        join_host_port(&self.advertise_host, self.port)
    }

    /// Where peers send this broker's SWIM datagrams.
    pub fn advertised_gossip_address(&self) -> String {
        join_host_port(&self.advertise_host, self.gossip_port)
    }
}

/// `host:port`, with an IPv6 host in brackets.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The address the client and inter-node ports listen on when nothing chooses one.
pub const DEFAULT_BIND: &str = "127.0.0.1";

/// Vnodes on a ring this broker creates, unless `MALACHI_LOG_VNODES` says otherwise.
pub const VNODES_DEFAULT: u32 = 8;
/// The floor the original puts under the segment age threshold.
pub const SEGMENT_MAX_AGE_MS_MIN: u64 = 60_000;
/// The shortest group session: a member idle in a long poll heartbeats about once a second,
/// and a heartbeat is a metadata commit, so shorter sessions would drop members that live.
pub const GROUP_SESSION_TIMEOUT_MS_MIN: u64 = 3_000;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}: invalid value {value:?}: {expected}")]
    Invalid { name: String, value: String, expected: &'static str },
    #[error("{name}: {problem}")]
    OutOfRange { name: String, problem: String },
}

/// Where values come from, in precedence order.
pub struct Sources<'a> {
    /// Command-line flags, by setting name without the prefix (`TCP_PORT`).
    pub flags: &'a BTreeMap<String, String>,
    /// The environment (a function, so tests need not touch the process environment).
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The optional TOML file's keys, by setting name in lower case (`tcp_port`).
    pub file: &'a BTreeMap<String, String>,
}

impl Sources<'_> {
    fn raw(&self, name: &str) -> Option<(String, String)> {
        let variable = format!("MALACHI_{name}");
        if let Some(value) = self.flags.get(name) {
            return Some((variable, value.clone()));
        }
        if let Some(value) = (self.env)(&variable) {
            return Some((variable, value));
        }
        self.file.get(&name.to_ascii_lowercase()).map(|value| (variable, value.clone()))
    }

    fn optional<T: FromStr>(
        &self,
        name: &str,
        expected: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        match self.raw(name) {
            None => Ok(None),
            Some((_, value)) if value.trim().is_empty() => Ok(None),
            Some((variable, value)) => value
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| ConfigError::Invalid { name: variable, value, expected }),
        }
    }

    fn number<T: FromStr>(&self, name: &str, default: T) -> Result<T, ConfigError> {
        Ok(self.optional(name, "a non-negative whole number")?.unwrap_or(default))
    }

    fn flag(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.raw(name) {
            None => Ok(default),
            Some((variable, value)) => match value.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Ok(true),
                "false" | "0" | "no" | "off" => Ok(false),
                _ => Err(ConfigError::Invalid { name: variable, value, expected: "true or false" }),
            },
        }
    }

    fn text(&self, name: &str) -> Option<String> {
        self.raw(name).map(|(_, value)| value).filter(|value| !value.is_empty())
    }
}

impl BrokerConfig {
    pub fn load(sources: &Sources<'_>) -> Result<BrokerConfig, ConfigError> {
        let config = BrokerConfig {
            bind_address: sources.text("BIND_ADDRESS").unwrap_or_else(|| DEFAULT_BIND.into()),
            tcp_port: sources.number("TCP_PORT", 4040)?,
            max_frame_bytes: sources.number("MAX_FRAME_SIZE", 16 * 1024 * 1024)?,
            auth_timeout_ms: sources.number("AUTH_TIMEOUT_MS", 10_000)?,
            tcp_recv_timeout_ms: sources.number("TCP_RECV_TIMEOUT", 30_000)?,
            tcp_send_timeout_ms: sources.number("TCP_SEND_TIMEOUT", 30_000)?,
            shutdown_grace_ms: sources.number("SHUTDOWN_GRACE_MS", 5_000)?,
            shutdown_timeout_ms: sources.number("SHUTDOWN_TIMEOUT_MS", 30_000)?,
            connection_limit_enabled: sources.flag("CONNECTION_LIMIT_ENABLED", true)?,
            max_conn_per_ip: sources.number("MAX_CONN_PER_IP", 100)?,
            max_total_conn: sources.number("MAX_TOTAL_CONN", 10_000)?,
            max_unauthenticated_conn: sources.number("MAX_UNAUTHENTICATED_CONN", 512)?,
            data_dir: sources.text("LOG_DATA_DIR").unwrap_or_else(|| "malachi-data".into()).into(),
            segment_max_bytes: sources.number("SEGMENT_MAX_BYTES", 64 * 1024 * 1024)?,
            segment_max_age_ms: sources.number("SEGMENT_MAX_AGE_MS", 604_800_000)?,
            group_commit_linger_us: sources.number::<u64>("GROUP_COMMIT_INTERVAL_MS", 0)? * 1000,
            group_commit_max_records: sources.number("GROUP_COMMIT_FLUSH_MAX_RECORDS", 20_000)?,
            group_commit_max_bytes: sources
                .number("GROUP_COMMIT_FLUSH_MAX_BYTES", 8 * 1024 * 1024)?,
            group_commit_barrier: barrier(sources)?,
            journal_bytes: sources.number("JOURNAL_BYTES", 128 * 1024 * 1024)?,
            retention_max_age_ms: sources.optional("RETENTION_MAX_AGE_MS", "milliseconds")?,
            retention_max_bytes: sources.optional("RETENTION_MAX_BYTES", "bytes")?,
            retention_interval_ms: sources.number("RETENTION_INTERVAL_MS", 60_000)?,
            retention_unresolved_policy_max_age_ms: sources
                .optional("RETENTION_UNRESOLVED_POLICY_MAX_AGE_MS", "milliseconds")?,
            admin_pass: sources.text("ADMIN_PASS"),
            default_users: sources.text("DEFAULT_USERS"),
            disable_default_users: sources.flag("DISABLE_DEFAULT_USERS", false)?,
            min_password_len: sources.number("MIN_PASSWORD_LEN", 12)?,
            acl_strict: sources.flag("ACL_STRICT", false)?,
            rate_limit_enabled: sources.flag("RATE_LIMIT_ENABLED", true)?,
            auth_rate_limit: sources.number("AUTH_RATE_LIMIT", 10)?,
            auth_rate_window_ms: sources.number("AUTH_RATE_WINDOW_MS", 60_000)?,
            max_auth_attempts: sources.number("MAX_AUTH_ATTEMPTS", 5)?,
            lockout_duration_ms: sources.number("LOCKOUT_DURATION_MS", 300_000)?,
            progressive_lockout: sources.flag("PROGRESSIVE_LOCKOUT", true)?,
            load: load_config(sources)?,
            max_open_segments: sources.number("MAX_OPEN_SEGMENTS", 1_024)?,
            max_topics: sources.number("MAX_TOPICS", 10_000)?,
            max_active_ranges: sources.number("MAX_ACTIVE_RANGES", 16_384)?,
            max_topics_per_user: sources.number("MAX_TOPICS_PER_USER", 100)?,
            group_session_timeout_ms: sources
                .number("GROUP_SESSION_TIMEOUT_MS", crate::groups::SESSION_TIMEOUT_MS)?,
            node_id: sources.optional("NODE_ID", "a node id of 1 or more")?,
            attributes: attributes(sources)?,
            security: security::load(sources)?,
            dashboard: dashboard_config(sources)?,
            cluster: cluster_config(sources)?,
        };
        config.validate()?;
        Ok(config)
    }

    /// The resource bounds metadata commands carry (see [`malachi_meta::Quota`]).
    pub fn quota(&self) -> malachi_meta::Quota {
        malachi_meta::Quota {
            max_topics: Some(self.max_topics),
            max_active_ranges: Some(self.max_active_ranges),
            max_topics_per_creator: Some(self.max_topics_per_user),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let checks: [(&str, bool, String); 8] = [
            (
                "MALACHI_SEGMENT_MAX_AGE_MS",
                self.segment_max_age_ms >= SEGMENT_MAX_AGE_MS_MIN,
                format!("must be at least {SEGMENT_MAX_AGE_MS_MIN}"),
            ),
            (
                "MALACHI_MAX_FRAME_SIZE",
                self.max_frame_bytes >= 1024,
                "must be at least 1024".into(),
            ),
            (
                "MALACHI_SEGMENT_MAX_BYTES",
                self.segment_max_bytes >= 4096,
                "must be at least 4096".into(),
            ),
            (
                "MALACHI_ADMIN_PASS",
                self.admin_pass.as_ref().is_none_or(|pass| {
                    crate::auth::check_password_length(pass, self.min_password_len).is_ok()
                }),
                format!("must be at least {} characters", self.min_password_len),
            ),
            (
                "MALACHI_GROUP_COMMIT_FLUSH_MAX_RECORDS",
                self.group_commit_max_records >= 1,
                "must be at least 1".into(),
            ),
            (
                "MALACHI_MAX_OPEN_SEGMENTS",
                self.max_open_segments >= 16,
                "must be at least 16".into(),
            ),
            (
                "MALACHI_GROUP_SESSION_TIMEOUT_MS",
                self.group_session_timeout_ms >= GROUP_SESSION_TIMEOUT_MS_MIN,
                format!("must be at least {GROUP_SESSION_TIMEOUT_MS_MIN}"),
            ),
            (
                "MALACHI_REPLICATION_CATCH_UP_BYTES",
                self.cluster.replication_catch_up_bytes >= 1,
                "must be at least 1".into(),
            ),
        ];
        for (name, ok, problem) in checks {
            if !ok {
                return Err(ConfigError::OutOfRange { name: name.into(), problem });
            }
        }
        Ok(())
    }
}

/// The HTTP port's settings (`MALACHI_DASHBOARD_*`, `MALACHI_SESSION_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DashboardConfig {
    /// Serve HTTP at all (`MALACHI_DASHBOARD_ENABLED`, ours).
    pub enabled: bool,
    /// `MALACHI_DASHBOARD_PORT`, on the client port's bind address; 0 picks a free port.
    pub port: u16,
    /// The console asks for a login (`MALACHI_DASHBOARD_AUTH_ENABLED`); `/health`, `/ready`
    /// and `/metrics` never do.
    pub auth_enabled: bool,
    /// Only admins may log in to the console (`MALACHI_DASHBOARD_REQUIRE_ADMIN`).
    pub require_admin: bool,
    /// A console session ends this long after its last use (`MALACHI_SESSION_TIMEOUT_SEC`).
    pub session_timeout_sec: u64,
    /// A console session is refused from another address than the one it logged in from
    /// (`MALACHI_SESSION_IP_BINDING`).
    pub session_ip_binding: bool,
    /// Topics with a label of their own in `/metrics`; the rest count as `_other`
    /// (`MALACHI_METRICS_TOPICS_MAX`, ours).
    pub metrics_topics_max: u32,
}

fn dashboard_config(sources: &Sources<'_>) -> Result<DashboardConfig, ConfigError> {
    Ok(DashboardConfig {
        enabled: sources.flag("DASHBOARD_ENABLED", true)?,
        port: sources.number("DASHBOARD_PORT", 4041)?,
        auth_enabled: sources.flag("DASHBOARD_AUTH_ENABLED", true)?,
        require_admin: sources.flag("DASHBOARD_REQUIRE_ADMIN", true)?,
        session_timeout_sec: sources.number("SESSION_TIMEOUT_SEC", 3600)?,
        session_ip_binding: sources.flag("SESSION_IP_BINDING", true)?,
        metrics_topics_max: sources.number("METRICS_TOPICS_MAX", 200)?,
    })
}

fn cluster_config(sources: &Sources<'_>) -> Result<ClusterConfig, ConfigError> {
    let bind: String = sources.text("BIND_ADDRESS").unwrap_or_else(|| DEFAULT_BIND.to_string());
    let seeds = match sources.raw("LOG_NODES") {
        None => Vec::new(),
        Some((variable, value)) => {
            let seeds: Vec<String> = value
                .split(',')
                .map(str::trim)
                .filter(|seed| !seed.is_empty())
                .map(str::to_string)
                .collect();
            if let Some(bad) = seeds.iter().find(|seed| !looks_like_host_port(seed)) {
                return Err(ConfigError::Invalid {
                    name: variable,
                    value: bad.clone(),
                    expected: "host:port of another broker's inter-node port",
                });
            }
            seeds
        }
    };
    let enabled = sources.raw("CLUSTER_PORT").is_some() || !seeds.is_empty();
    Ok(ClusterConfig {
        enabled,
        bind_address: sources.text("CLUSTER_BIND_ADDRESS").unwrap_or_else(|| bind.clone()),
        security: cluster_security(sources)?,
        vnodes: vnodes(sources)?,
        port: sources.number("CLUSTER_PORT", 4042)?,
        gossip_port: sources.number("CLUSTER_GOSSIP_PORT", 45892)?,
        vnode_voters: vnode_voters(sources)?,
        voter_replace_after_ms: sources.number("VOTER_REPLACE_AFTER_MS", 60_000)?,
        replication_factor: replication_factor(sources)?,
        placement: placement_constraints(sources)?,
        replication_timeout_ms: sources.number("REPLICATION_TIMEOUT_MS", 5_000)?,
        replica_replace_after_ms: sources.number("REPLICA_REPLACE_AFTER_MS", 60_000)?,
        replication_catch_up_bytes: sources.number("REPLICATION_CATCH_UP_BYTES", 4 << 20)?,
        replication_held_bytes_max: sources.number("REPLICATION_HELD_BYTES_MAX", 64 << 20)?,
        scrub: ScrubConfig {
            enabled: sources.flag("SCRUB_ENABLED", true)?,
            interval_ms: sources.number("SCRUB_INTERVAL_MS", 60_000)?,
            segments_per_tick: sources.number("SCRUB_SEGMENTS_PER_TICK", 1)?,
        },
        advertise_host: sources.text("ADVERTISE_HOST").unwrap_or(bind),
        seeds,
    })
}

/// `MALACHI_CLUSTER_INSECURE`, the operator's certificate files, or the managed CA and token.
fn cluster_security(sources: &Sources<'_>) -> Result<ClusterSecurity, ConfigError> {
    if sources.flag("CLUSTER_INSECURE", false)? {
        return Ok(ClusterSecurity::Insecure);
    }
    let files = ["CLUSTER_TLS_CACERTFILE", "CLUSTER_TLS_CERTFILE", "CLUSTER_TLS_KEYFILE"]
        .map(|name| sources.text(name).map(PathBuf::from));
    match files {
        [Some(ca_file), Some(cert_file), Some(key_file)] => {
            return Ok(ClusterSecurity::Provided { ca_file, cert_file, key_file });
        }
        [None, None, None] => {}
        _ => {
            return Err(ConfigError::OutOfRange {
                name: "MALACHI_CLUSTER_TLS_CACERTFILE".into(),
                problem: "set all three of MALACHI_CLUSTER_TLS_CACERTFILE, _CERTFILE and \
                          _KEYFILE, or none"
                    .into(),
            });
        }
    }
    let token = sources.raw("CLUSTER_TOKEN").map(|(_, token)| token.trim().to_string());
    if let Some(token) = &token
        && let Err(error) = malachi_transport::pki::check_token(token)
    {
        return Err(ConfigError::OutOfRange {
            name: "MALACHI_CLUSTER_TOKEN".into(),
            problem: error.to_string(),
        });
    }
    Ok(ClusterSecurity::Managed { token })
}

/// Vnodes on the ring: 8 by default, for a broker alone too. With 3 to 5 brokers, 8 vnodes give
/// every broker one to three vnodes to lead, so coordination and metadata writes spread, while
/// each broker runs 8 groups' heartbeats, a few hundred small messages a second. A broker alone
/// gets the same ring because the ring keeps the size of its first start: the most common path,
/// one broker that later grows into three, must not keep its topics in one group forever. Alone,
/// the 8 groups cost nothing a client sees (one voter sends no heartbeats; their writes share
/// the Raft store's batches).
fn vnodes(sources: &Sources<'_>) -> Result<u32, ConfigError> {
    let vnodes: u32 = sources.number("LOG_VNODES", VNODES_DEFAULT)?;
    malachi_meta::ring::check_ring(vnodes).map_err(|problem| ConfigError::OutOfRange {
        name: "MALACHI_LOG_VNODES".into(),
        problem,
    })?;
    Ok(vnodes)
}

/// Voters of a Raft group, odd so every majority is a strict one, and at most 7.
fn vnode_voters(sources: &Sources<'_>) -> Result<usize, ConfigError> {
    let voters: usize = sources.number("LOG_VNODE_REPLICATION_FACTOR", 3)?;
    if voters.is_multiple_of(2) || !(1..=7).contains(&voters) {
        return Err(ConfigError::OutOfRange {
            name: "MALACHI_LOG_VNODE_REPLICATION_FACTOR".into(),
            problem: format!("must be 1, 3, 5 or 7, not {voters}"),
        });
    }
    Ok(voters)
}

/// Replicas of a segment: 1 to 7 (any count works; odd ones waste no replica on the quorum).
fn replication_factor(sources: &Sources<'_>) -> Result<usize, ConfigError> {
    let replicas: usize = sources.number("LOG_REPLICATION_FACTOR", 3)?;
    if !(1..=7).contains(&replicas) {
        return Err(ConfigError::OutOfRange {
            name: "MALACHI_LOG_REPLICATION_FACTOR".into(),
            problem: format!("must be 1 to 7, not {replicas}"),
        });
    }
    Ok(replicas)
}

fn placement_constraints(
    sources: &Sources<'_>,
) -> Result<malachi_meta::placement::Constraints, ConfigError> {
    use malachi_meta::placement::{Constraints, PlacementMode};
    let mode = match sources.raw("LOG_PLACEMENT_POLICY") {
        None => PlacementMode::Soft,
        Some((variable, value)) => match value.trim() {
            "soft" => PlacementMode::Soft,
            "hard" => PlacementMode::Hard,
            _ => {
                return Err(ConfigError::Invalid {
                    name: variable,
                    value,
                    expected: "soft or hard",
                });
            }
        },
    };
    let max_skew = match sources.raw("LOG_MAX_SKEW") {
        None => None,
        Some(_) => Some(sources.number("LOG_MAX_SKEW", 0u32)?),
    };
    Ok(Constraints {
        spread_by: sources.text("LOG_SPREAD_BY").filter(|name| !name.trim().is_empty()),
        min_domains: sources.number("LOG_MIN_DOMAINS", 0)?,
        max_skew,
        mode,
    })
}

fn looks_like_host_port(text: &str) -> bool {
    text.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

fn attributes(sources: &Sources<'_>) -> Result<BTreeMap<String, String>, ConfigError> {
    let Some((variable, value)) = sources.raw("LOG_ATTRIBUTES") else {
        return Ok(BTreeMap::new());
    };
    malachi_meta::placement::parse_attributes(&value).map_err(|problem| ConfigError::OutOfRange {
        name: variable,
        problem: format!("{problem} in {value:?}"),
    })
}

fn barrier(sources: &Sources<'_>) -> Result<crate::data::Barrier, ConfigError> {
    use crate::data::Barrier;
    match sources.raw("GROUP_COMMIT_BARRIER") {
        None => Ok(Barrier::default()),
        Some((variable, value)) => match value.trim() {
            "journal" => Ok(Barrier::Journal),
            "files" => Ok(Barrier::Files),
            "filesystem" => Ok(Barrier::Filesystem),
            _ => Err(ConfigError::Invalid {
                name: variable,
                value,
                expected: "journal, files or filesystem",
            }),
        },
    }
}

fn load_config(sources: &Sources<'_>) -> Result<LoadConfig, ConfigError> {
    let defaults = LoadConfig::default();
    Ok(LoadConfig {
        enabled: sources.flag("AUTO_SPLIT_ENABLED", defaults.enabled)?,
        window_ms: sources.number("AUTO_SPLIT_WINDOW_MS", defaults.window_ms)?,
        split_records_per_s: sources.number("SPLIT_RECORDS_PER_S", defaults.split_records_per_s)?,
        split_bytes_per_s: sources.number("SPLIT_BYTES_PER_S", defaults.split_bytes_per_s)?,
        merge_records_per_s: sources.number("MERGE_RECORDS_PER_S", defaults.merge_records_per_s)?,
        merge_bytes_per_s: sources.number("MERGE_BYTES_PER_S", defaults.merge_bytes_per_s)?,
        cooldown_ms: sources.number("RESHAPE_COOLDOWN_MS", defaults.cooldown_ms)?,
        ranges_per_topic_max: sources
            .number("MAX_RANGES_PER_TOPIC", defaults.ranges_per_topic_max)?,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn load(
        flags: &[(&str, &str)],
        env: &[(&str, &str)],
        file: &[(&str, &str)],
    ) -> Result<BrokerConfig, ConfigError> {
        let flags: BTreeMap<String, String> =
            flags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let file: BTreeMap<String, String> =
            file.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let env: BTreeMap<String, String> =
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = move |name: &str| env.get(name).cloned();
        BrokerConfig::load(&Sources { flags: &flags, env: &lookup, file: &file })
    }

    #[test]
    fn defaults_are_the_originals() {
        let config = load(&[], &[], &[]).unwrap();
        assert_eq!(config.tcp_port, 4040);
        assert_eq!(config.max_frame_bytes, 16_777_216);
        assert_eq!((config.max_conn_per_ip, config.max_total_conn), (100, 10_000));
        assert_eq!(config.segment_max_bytes, 67_108_864);
        assert_eq!((config.auth_rate_limit, config.auth_rate_window_ms), (10, 60_000));
        assert_eq!(config.retention_max_age_ms, None);
        assert!(config.attributes.is_empty());
        let replication =
            (config.cluster.replication_catch_up_bytes, config.cluster.replication_held_bytes_max);
        assert_eq!(replication, (4 << 20, 64 << 20));
        let zoned = load(&[], &[("MALACHI_LOG_ATTRIBUTES", "rack=a,zone=eu-1")], &[]).unwrap();
        let zone = zoned.attributes.get("zone").map(String::as_str);
        assert_eq!((zoned.attributes.len(), zone), (2, Some("eu-1")));
    }

    #[test]
    fn the_inter_node_port_is_secure_unless_told_otherwise() {
        let token = "a-cluster-token-of-32-characters!";
        type Case<'a> = (&'a [(&'a str, &'a str)], Result<ClusterSecurity, &'a str>);
        let cases: [Case<'_>; 6] = [
            (&[], Ok(ClusterSecurity::Managed { token: None })),
            (
                &[("MALACHI_CLUSTER_TOKEN", token)],
                Ok(ClusterSecurity::Managed { token: Some(token.into()) }),
            ),
            (&[("MALACHI_CLUSTER_TOKEN", "short")], Err("MALACHI_CLUSTER_TOKEN: ")),
            (&[("MALACHI_CLUSTER_INSECURE", "true")], Ok(ClusterSecurity::Insecure)),
            (
                &[
                    ("MALACHI_CLUSTER_TLS_CACERTFILE", "ca.pem"),
                    ("MALACHI_CLUSTER_TLS_CERTFILE", "node.pem"),
                    ("MALACHI_CLUSTER_TLS_KEYFILE", "node.key"),
                ],
                Ok(ClusterSecurity::Provided {
                    ca_file: "ca.pem".into(),
                    cert_file: "node.pem".into(),
                    key_file: "node.key".into(),
                }),
            ),
            (&[("MALACHI_CLUSTER_TLS_CERTFILE", "node.pem")], Err("set all three")),
        ];
        for (env, expected) in cases {
            match (load(&[], env, &[]), expected) {
                (Ok(config), Ok(expected)) => assert_eq!(config.cluster.security, expected),
                (Err(error), Err(expected)) => {
                    assert!(error.to_string().contains(expected), "{env:?}: {error}");
                }
                (got, expected) => panic!("{env:?}: {got:?}, expected {expected:?}"),
            }
        }
        let split = load(&[], &[("MALACHI_CLUSTER_BIND_ADDRESS", "10.0.0.1")], &[]).unwrap();
        assert_eq!(
            (split.bind_address.as_str(), split.cluster.bind_address.as_str()),
            (DEFAULT_BIND, "10.0.0.1")
        );
        assert_eq!(load(&[], &[], &[]).unwrap().cluster.bind_address, DEFAULT_BIND);
    }

    #[test]
    fn precedence_is_flag_env_file_default() {
        let port = |flags: &[(&str, &str)], env: &[(&str, &str)], file: &[(&str, &str)]| {
            load(flags, env, file).unwrap().tcp_port
        };
        assert_eq!(
            port(&[("TCP_PORT", "1")], &[("MALACHI_TCP_PORT", "2")], &[("tcp_port", "3")]),
            1
        );
        assert_eq!(port(&[], &[("MALACHI_TCP_PORT", "2")], &[("tcp_port", "3")]), 2);
        assert_eq!(port(&[], &[], &[("tcp_port", "3")]), 3);
    }

    /// `MALACHI_ADMIN_PASS` is held to `MALACHI_MIN_PASSWORD_LEN`, not to a fixed 12.
    #[test]
    fn the_admin_password_is_held_to_the_configured_minimum() {
        let cases = [
            ("ten-chars!", "12", false),
            ("ten-chars!", "10", true),
            ("twelve-chars", "12", true),
            ("twelve-chars", "16", false),
        ];
        for (password, min_chars, accepted) in cases {
            let env = [("MALACHI_ADMIN_PASS", password), ("MALACHI_MIN_PASSWORD_LEN", min_chars)];
            match load(&[], &env, &[]) {
                Ok(_) => assert!(accepted, "{password} against {min_chars} was accepted"),
                Err(error) => {
                    assert!(!accepted, "{password} against {min_chars}: {error}");
                    let expected = format!("MALACHI_ADMIN_PASS: must be at least {min_chars}");
                    assert!(error.to_string().starts_with(&expected), "{error}");
                }
            }
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            (("MALACHI_TCP_PORT", "http"), "MALACHI_TCP_PORT: invalid value \"http\""),
            (("MALACHI_ACL_STRICT", "maybe"), "MALACHI_ACL_STRICT: invalid value \"maybe\""),
            (
                ("MALACHI_SEGMENT_MAX_AGE_MS", "1000"),
                "MALACHI_SEGMENT_MAX_AGE_MS: must be at least 60000",
            ),
            (("MALACHI_ADMIN_PASS", "short"), "MALACHI_ADMIN_PASS: must be at least 12 characters"),
            (("MALACHI_TCP_PORT", "70000"), "MALACHI_TCP_PORT: invalid value \"70000\""),
            (
                ("MALACHI_LOG_ATTRIBUTES", "rack"),
                "MALACHI_LOG_ATTRIBUTES: attribute \"rack\" is not name=value",
            ),
            (
                ("MALACHI_REPLICATION_CATCH_UP_BYTES", "0"),
                "MALACHI_REPLICATION_CATCH_UP_BYTES: must be at least 1",
            ),
            (
                ("MALACHI_GROUP_SESSION_TIMEOUT_MS", "2999"),
                "MALACHI_GROUP_SESSION_TIMEOUT_MS: must be at least 3000",
            ),
        ];
        for ((name, value), expected) in cases {
            let message = load(&[], &[(name, value)], &[]).unwrap_err().to_string();
            assert!(message.starts_with(expected), "{name}={value}: {message}");
        }
    }
}
