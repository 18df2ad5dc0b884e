//! Starting a broker that is a member of a cluster (`MALACHI_CLUSTER_PORT` or
//! `MALACHI_LOG_NODES` set): its identity, the inter-node port, and joining.
//!
//! * A broker with no seeds starts a cluster of its own (or restarts as a member of it).
//! * A broker with seeds and a new data directory asks a seed for the welcome (the cluster id
//!   and cursor secret), records both, opens its groups waiting for their leaders, and joins.
//! * A broker with a data directory of the cluster restarts as the same member; one that never
//!   finished joining (a group of it has no voters) joins again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use malachi_broker::cluster::{Welcome, fetch_welcome, peer_handler};
use malachi_broker::config::{BrokerConfig, join_host_port};
use malachi_broker::gossip::Gossip;
use malachi_broker::node::{BootReport, Broker, ClusterDeps, NodeDeps, write_cursor_secret};
use malachi_consensus::FirstBoot;
use malachi_transport::Transport;
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
}

pub async fn open_member(config: BrokerConfig) -> Result<Member, String> {
    let data_dir = config.data_dir.clone();
    let seeds = config.cluster.seeds.clone();
    let first_boot = !identity::exists(&data_dir);
    let node_id = config.node_id.unwrap_or(identity::DEFAULT_NODE_ID);
    let transport = Transport::new(node_id, "");
    let mut vnodes_hint = None;
    let identity = if first_boot && !seeds.is_empty() {
        let welcome = welcome_from_any(&transport, &seeds).await?;
        vnodes_hint = welcome.vnodes;
        let storage = malachi_log::storage::RealStorage;
        malachi_broker::node::create_data_dir(&storage, &data_dir)
            .map_err(|error| format!("{}: {error}", data_dir.display()))?;
        write_cursor_secret(&data_dir, welcome.cursor_secret)
            .map_err(|error| format!("{}: {error}", data_dir.display()))?;
        identity::load_or_create(&data_dir, Some(&welcome.cluster_id), config.node_id)
    } else {
        identity::load_or_create(&data_dir, None, config.node_id)
    }
    .map_err(|error| error.to_string())?;
    let transport = Transport::new(identity.node_id, &identity.cluster_id);
    if !first_boot {
        let welcome = refuse_another_cluster(&transport, &seeds).await?;
        vnodes_hint = welcome.and_then(|welcome| welcome.vnodes);
    }
    let listen = join_host_port(&config.bind_address, config.cluster.port);
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|error| format!("binding the inter-node port {listen}: {error}"))?;
    tokio::spawn(transport.clone().serve(listener));
    let (gossip_socket, gossip_addr) = bind_gossip(&config).await?;
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
    let report = match broker.bootstrap().await {
        Ok(report) => report,
        Err(error) => {
            broker.shutdown().await;
            return Err(error.to_string());
        }
    };
    let gossip = broker.spawn_gossip(gossip_socket, gossip_addr)?;
    Ok(Member { broker, report, identity, gossip })
}

/// The membership socket on the bind address, and the address other brokers send to (the
/// advertised host's, resolved now).
async fn bind_gossip(config: &BrokerConfig) -> Result<(UdpSocket, SocketAddr), String> {
    let listen = join_host_port(&config.bind_address, config.cluster.gossip_port);
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
