//! Starting a broker that is a member of a cluster (`MALACHI_CLUSTER_PORT` or
//! `MALACHI_LOG_NODES` set): its identity, the inter-node port, and joining.
//!
//! * A broker with no seeds starts a cluster of its own (or restarts as a member of it).
//! * A broker with seeds and a new data directory asks a seed for the welcome (the cluster id
//!   and cursor secret), records both, opens its groups waiting for their leaders, and joins.
//! * A broker with a data directory of the cluster restarts as the same member; one that never
//!   finished joining (a group of it has no voters) joins again.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use malachi_broker::cluster::{Welcome, fetch_welcome};
use malachi_broker::config::{BrokerConfig, ClusterSecurity, join_host_port};
use malachi_broker::enroll;
use malachi_broker::gossip::Gossip;
use malachi_broker::node::{
    BootError, BootReport, Broker, ClusterDeps, NodeDeps, write_cursor_secret,
};
use malachi_broker::peer::peer_handler;
use malachi_consensus::{ConsensusError, FirstBoot};
use malachi_transport::gossip_seal::GossipSeal;
use malachi_transport::pki::{self, ClusterCa, ClusterFiles};
use malachi_transport::{ClusterTls, Security, Transport};
use tokio::net::UdpSocket;

use crate::identity::{self, NodeIdentity};

/// How long a first boot keeps asking its seeds for a welcome: a whole cluster may be starting
/// at once, the seed a little after this broker.
const WELCOME_WAIT_MS: u64 = 30_000;
const WELCOME_RETRY_MS: u64 = 500;

/// A broker of a cluster, started and joined, with its membership running.
pub struct Member {
    pub broker: Arc<Broker>,
    pub report: BootReport,
    pub identity: NodeIdentity,
    pub gossip: Gossip,
    /// The join token this broker generated at the cluster's creation, to show once.
    pub generated_token: Option<String>,
}

pub async fn open_member(config: BrokerConfig) -> Result<Member, String> {
    let data_dir = config.data_dir.clone();
    let seeds = config.cluster.seeds.clone();
    let first_boot = !identity::exists(&data_dir);
    if matches!(config.cluster.security, ClusterSecurity::Insecure) {
        tracing::warn!(
            "MALACHI_CLUSTER_INSECURE=true: the inter-node and gossip ports are plain text and \
             believe any peer's word; anyone who reaches them controls this cluster"
        );
    }
    let mut vnodes_hint = None;
    let mut generated_token = None;
    let (identity, transport, files) = if first_boot && !seeds.is_empty() {
        let node_id = config.node_id.unwrap_or(identity::DEFAULT_NODE_ID);
        let storage = malachi_log::storage::RealStorage;
        malachi_broker::node::create_data_dir(&storage, &data_dir)
            .map_err(|error| format!("{}: {error}", data_dir.display()))?;
        let (security, files) = joiner_security(&config, node_id, "").await?;
        let transport = Transport::new(node_id, "", security);
        let welcome = welcome_from_any(&transport, &seeds).await?;
        vnodes_hint = welcome.vnodes;
        write_cursor_secret(&data_dir, welcome.cursor_secret)
            .map_err(|error| format!("{}: {error}", data_dir.display()))?;
        let identity =
            identity::load_or_create(&data_dir, Some(&welcome.cluster_id), config.node_id)
                .map_err(|error| error.to_string())?;
        transport.set_cluster_id(&identity.cluster_id);
        (identity, transport, files)
    } else {
        let identity = identity::load_or_create(&data_dir, None, config.node_id)
            .map_err(|error| error.to_string())?;
        let (security, files, token) = if seeds.is_empty() {
            creator_security(&config, &identity)?
        } else {
            let (security, files) =
                joiner_security(&config, identity.node_id, &identity.cluster_id).await?;
            (security, files, None)
        };
        generated_token = token;
        let transport = Transport::new(identity.node_id, &identity.cluster_id, security);
        if !first_boot {
            let welcome = refuse_another_cluster(&transport, &seeds).await?;
            vnodes_hint = welcome.and_then(|welcome| welcome.vnodes);
        }
        (identity, transport, files)
    };
    let listen = join_host_port(&config.cluster.bind_address, config.cluster.port);
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|error| format!("binding the inter-node port {listen}: {error}"))?;
    tokio::spawn(transport.clone().serve(listener));
    let (gossip_socket, gossip_addr) = bind_gossip(&config).await?;
    let config_security = config.cluster.security.clone();
    let files_for_seal = files.clone();
    let deps = NodeDeps {
        cluster: Some(ClusterDeps {
            transport: transport.clone(),
            cluster_id: identity.cluster_id.clone(),
            first_boot: if seeds.is_empty() {
                FirstBoot::Initialize
            } else {
                FirstBoot::AwaitLeader
            },
            vnodes_hint,
            cluster_files: files,
        }),
        ..NodeDeps::production(config, identity.node_id)
    };
    let broker = Broker::start(deps).await.map_err(|error| error.to_string())?;
    transport.set_handler(peer_handler(&broker));
    broker.sync_addresses();
    let joining = !seeds.is_empty() && !broker.joined();
    if joining && let Err(error) = broker.join(&seeds).await {
        broker.shutdown().await;
        return Err(error);
    }
    let report = match bootstrap(&broker).await {
        Ok(report) => report,
        Err(error) => {
            broker.shutdown().await;
            return Err(error.to_string());
        }
    };
    let seal = gossip_seal(&config_security, files_for_seal.as_ref())?;
    let gossip = broker.spawn_gossip(gossip_socket, gossip_addr, seal)?;
    Ok(Member { broker, report, identity, gossip, generated_token })
}

/// Seeds the accounts and records this broker, retrying while the administrative group has no
/// leader: a join can move its leadership (a seat hands over), and the writes are idempotent.
async fn bootstrap(broker: &Broker) -> Result<BootReport, BootError> {
    const BOOTSTRAP_WAIT_MS: u64 = 30_000;
    const RETRY_MS: u64 = 200;
    let mut waited_ms = 0;
    loop {
        match broker.bootstrap().await {
            Err(BootError::Consensus(
                error @ (ConsensusError::NotLeader { .. }
                | ConsensusError::OutcomeUnknown { .. }
                | ConsensusError::Timeout { .. }),
            )) if waited_ms < BOOTSTRAP_WAIT_MS => {
                tracing::info!(%error, "the administrative group has no leader yet; retrying");
                tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
                waited_ms += RETRY_MS;
            }
            outcome => return outcome,
        }
    }
}

/// The key gossip is sealed with: derived from the cluster's token (the data directory's; also
/// `MALACHI_CLUSTER_TOKEN` and a previous token, opened but not sealed with, during a rotation).
/// Plain gossip when the inter-node port is insecure, or for brought certificates without a
/// token.
fn gossip_seal(
    security: &ClusterSecurity,
    files: Option<&ClusterFiles>,
) -> Result<Option<Arc<GossipSeal>>, String> {
    let configured = match security {
        ClusterSecurity::Insecure => return Ok(None),
        ClusterSecurity::Provided { .. } => None,
        ClusterSecurity::Managed { token } => token.clone(),
    };
    let read = |token: Result<Option<String>, pki::PkiError>| token.map_err(|e| e.to_string());
    let kept = match files {
        Some(files) => read(files.read_token())?,
        None => None,
    };
    let previous = match files {
        Some(files) => read(files.read_previous_token())?,
        None => None,
    };
    let tokens: Vec<&str> =
        [&kept, &configured, &previous].into_iter().flatten().map(String::as_str).collect();
    if tokens.is_empty() {
        tracing::warn!(
            "gossip (MALACHI_CLUSTER_GOSSIP_PORT) is not sealed: brought certificates and no \
             MALACHI_CLUSTER_TOKEN to derive its key from; keep the port on a private network"
        );
        return Ok(None);
    }
    Ok(Some(Arc::new(GossipSeal::from_tokens(&tokens))))
}

/// The security of a broker that creates the cluster (or restarts as its first member): its
/// CA, certificate and token, made now if its data directory has none. Also the token, when
/// it was generated now, to show once.
fn creator_security(
    config: &BrokerConfig,
    identity: &NodeIdentity,
) -> Result<(Security, Option<ClusterFiles>, Option<String>), String> {
    let token = match &config.cluster.security {
        ClusterSecurity::Insecure => return Ok((Security::Insecure, None, None)),
        ClusterSecurity::Provided { .. } => {
            let (security, files) = provided_security(config, identity.node_id)?;
            return Ok((security, files, None));
        }
        ClusterSecurity::Managed { token } => token.clone(),
    };
    let files = ClusterFiles::in_data_dir(&config.data_dir);
    let mut generated = None;
    if !files.exist() {
        let token = token.unwrap_or_else(|| {
            let token = pki::generate_token();
            generated = Some(token.clone());
            token
        });
        let ca = ClusterCa::generate(&identity.cluster_id).map_err(|error| error.to_string())?;
        let node = ca.issue(identity.node_id).map_err(|error| error.to_string())?;
        files
            .write(&ca.credentials, &node, &token)
            .map_err(|error| format!("writing the cluster credentials: {error}"))?;
        tracing::info!(dir = %files.ca_cert.parent().unwrap_or(Path::new("")).display(), "created the cluster CA, this broker's certificate and the join token");
    }
    Ok((load_tls(&files, identity.node_id)?, Some(files), generated))
}

/// The security of a broker joining through seeds: its certificate, enrolled for now with the
/// token if its data directory has none.
async fn joiner_security(
    config: &BrokerConfig,
    node_id: u64,
    cluster_id: &str,
) -> Result<(Security, Option<ClusterFiles>), String> {
    let token = match &config.cluster.security {
        ClusterSecurity::Insecure => return Ok((Security::Insecure, None)),
        ClusterSecurity::Provided { .. } => return provided_security(config, node_id),
        ClusterSecurity::Managed { token } => token.clone(),
    };
    let files = ClusterFiles::in_data_dir(&config.data_dir);
    if !files.exist() {
        let token = token.ok_or_else(|| {
            format!(
                "joining a cluster takes its token: set MALACHI_CLUSTER_TOKEN to the token the \
                 cluster's first broker printed (kept in its {}); or run every broker with \
                 MALACHI_CLUSTER_INSECURE=true",
                Path::new("cluster").join("token").display()
            )
        })?;
        let ca = enroll_from_any(config, node_id, &token, &files).await?;
        if !cluster_id.is_empty() && ca.cluster_id != cluster_id {
            return Err(format!(
                "this data directory belongs to cluster {cluster_id}, the seeds to {}",
                ca.cluster_id
            ));
        }
    }
    Ok((load_tls(&files, node_id)?, Some(files)))
}

fn provided_security(
    config: &BrokerConfig,
    node_id: u64,
) -> Result<(Security, Option<ClusterFiles>), String> {
    let ClusterSecurity::Provided { ca_file, cert_file, key_file } = &config.cluster.security
    else {
        unreachable!("called for provided certificates only");
    };
    let files = ClusterFiles {
        ca_cert: ca_file.clone(),
        ca_key: None,
        node_cert: cert_file.clone(),
        node_key: key_file.clone(),
        token: None,
    };
    Ok((load_tls(&files, node_id)?, Some(files)))
}

/// This broker's TLS from `files`, whose certificate must name `node_id`.
fn load_tls(files: &ClusterFiles, node_id: u64) -> Result<Security, String> {
    let tls = ClusterTls::load(files.clone()).map_err(|error| error.to_string())?;
    if tls.node_id() != node_id {
        return Err(format!(
            "{}: the certificate is node {}'s, this broker is node {node_id}",
            files.node_cert.display(),
            tls.node_id()
        ));
    }
    Ok(Security::Tls(Arc::new(tls)))
}

/// Enrolls through the first seed that answers, retrying them for a while (the cluster may be
/// starting); a seed that refuses the token ends it at once.
async fn enroll_from_any(
    config: &BrokerConfig,
    node_id: u64,
    token: &str,
    files: &ClusterFiles,
) -> Result<ClusterCa, String> {
    let transport = Transport::new(node_id, "", Security::Unenrolled);
    let address = config.cluster.advertised_cluster_address();
    let mut waited_ms = 0;
    loop {
        let mut errors = Vec::new();
        for seed in &config.cluster.seeds {
            match enroll::enroll_through(&transport, seed, token, &address, files).await {
                Ok(ca) => return Ok(ca),
                Err(error) if error.contains(enroll::WRONG_TOKEN) || error.contains("is taken") => {
                    return Err(format!("the seed refused this broker: {error}"));
                }
                Err(error) => errors.push(error),
            }
        }
        if waited_ms >= WELCOME_WAIT_MS {
            return Err(format!(
                "no seed of MALACHI_LOG_NODES enrolled this broker: {}",
                errors.join("; ")
            ));
        }
        tracing::info!(errors = %errors.join("; "), "waiting for a seed to enroll this broker");
        tokio::time::sleep(Duration::from_millis(WELCOME_RETRY_MS)).await;
        waited_ms += WELCOME_RETRY_MS;
    }
}

/// The membership socket on the bind address, and the address other brokers send to (the
/// advertised host's, resolved now).
async fn bind_gossip(config: &BrokerConfig) -> Result<(UdpSocket, SocketAddr), String> {
    let listen = join_host_port(&config.cluster.bind_address, config.cluster.gossip_port);
    let socket = UdpSocket::bind(&listen)
        .await
        .map_err(|error| format!("binding the gossip port {listen} (UDP): {error}"))?;
    let advertised = config.cluster.advertised_gossip_address();
    let resolved = tokio::net::lookup_host(&advertised).await.ok().and_then(|mut all| all.next());
    let address = resolved.ok_or_else(|| {
        format!(
            "the advertised gossip address {advertised} does not resolve (MALACHI_ADVERTISE_HOST)"
        )
    })?;
    Ok((socket, address))
}

/// Stops a broker whose data directory belongs to another cluster than its seeds: a seed
/// refuses its hello, naming both clusters. Seeds that cannot be reached prove nothing (the
/// whole cluster may be restarting), so the start goes on. The welcome of the seed that
/// answered, if any: it tells the ring's size to a broker that never finished joining.
async fn refuse_another_cluster(
    transport: &Transport,
    seeds: &[String],
) -> Result<Option<Welcome>, String> {
    for seed in seeds {
        match fetch_welcome(transport, seed).await {
            Ok(welcome) if welcome.cluster_id != transport.cluster_id() => {
                return Err(format!(
                    "this data directory belongs to cluster {}, the seed {seed} to {}",
                    transport.cluster_id(),
                    welcome.cluster_id
                ));
            }
            Ok(welcome) => return Ok(Some(welcome)),
            Err(error) if error.contains("refused by") => {
                return Err(format!("the seed refused this broker: {error}"));
            }
            Err(error) => tracing::warn!(%seed, %error, "seed not reachable at start"),
        }
    }
    Ok(None)
}

/// The welcome of the first seed that answers, retrying all of them for a while.
async fn welcome_from_any(transport: &Transport, seeds: &[String]) -> Result<Welcome, String> {
    let mut waited_ms = 0;
    loop {
        let mut errors = Vec::new();
        for seed in seeds {
            match fetch_welcome(transport, seed).await {
                Ok(welcome) => return Ok(welcome),
                Err(error) => errors.push(error),
            }
        }
        if waited_ms >= WELCOME_WAIT_MS {
            return Err(format!("no seed of MALACHI_LOG_NODES answered: {}", errors.join("; ")));
        }
        tracing::info!(errors = %errors.join("; "), "waiting for a seed to answer");
        tokio::time::sleep(Duration::from_millis(WELCOME_RETRY_MS)).await;
        waited_ms += WELCOME_RETRY_MS;
    }
}
