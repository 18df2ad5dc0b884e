//! `malachi serve`: run a broker. With no configuration it is a complete single-node broker with
//! its data in `./malachi-data`, listening on 127.0.0.1:4040.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use malachi_broker::config::{BrokerConfig, Sources};
use malachi_broker::node::{Broker, NodeDeps};
use malachi_server::Server;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Data directory [env: MALACHI_LOG_DATA_DIR] [default: ./malachi-data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Client protocol port [env: MALACHI_TCP_PORT] [default: 4040]
    #[arg(long)]
    port: Option<u16>,
    /// Address to listen on [env: MALACHI_BIND_ADDRESS] [default: 127.0.0.1]
    #[arg(long)]
    bind: Option<String>,
    /// A TOML file of settings (keys are the MALACHI_* names in lower case, without the prefix).
    #[arg(long)]
    config: Option<PathBuf>,
    /// This broker's node id, recorded in the data directory at its first boot and kept after
    /// [env: MALACHI_NODE_ID] [default: 1 for a new data directory, then the recorded one]
    #[arg(long)]
    node_id: Option<u64>,
    /// Inter-node port; setting it (or --join) makes this broker a member of a cluster
    /// [env: MALACHI_CLUSTER_PORT] [default: 4042]
    #[arg(long)]
    cluster_port: Option<u16>,
    /// Inter-node addresses (host:port) of brokers to join, comma-separated
    /// [env: MALACHI_LOG_NODES]
    #[arg(long)]
    join: Option<String>,
    /// The host other brokers and clients use for this one [env: MALACHI_ADVERTISE_HOST]
    /// [default: the bind address]
    #[arg(long)]
    advertise_host: Option<String>,
    /// Membership (SWIM) port, UDP [env: MALACHI_CLUSTER_GOSSIP_PORT] [default: 45892]
    #[arg(long)]
    gossip_port: Option<u16>,
    /// This broker's placement attributes, `name=value` comma-separated (`rack=a,zone=eu-1`)
    /// [env: MALACHI_LOG_ATTRIBUTES]
    #[arg(long)]
    attributes: Option<String>,
    /// HTTP port of the console, /metrics, /health and /ready, on the bind address; 0 picks a
    /// free one [env: MALACHI_DASHBOARD_PORT] [default: 4041]
    #[arg(long)]
    dashboard_port: Option<u16>,
}

pub fn run(args: ServeArgs) -> Result<(), String> {
    init_tracing();
    let config = load_config(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("starting the runtime: {error}"))?;
    runtime.block_on(serve(config))
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error"));
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

fn load_config(args: &ServeArgs) -> Result<BrokerConfig, String> {
    let mut flags = BTreeMap::new();
    if let Some(dir) = &args.data_dir {
        flags.insert("LOG_DATA_DIR".to_string(), dir.display().to_string());
    }
    if let Some(port) = args.port {
        flags.insert("TCP_PORT".to_string(), port.to_string());
    }
    if let Some(bind) = &args.bind {
        flags.insert("BIND_ADDRESS".to_string(), bind.clone());
    }
    if let Some(node_id) = args.node_id {
        flags.insert("NODE_ID".to_string(), node_id.to_string());
    }
    if let Some(port) = args.cluster_port {
        flags.insert("CLUSTER_PORT".to_string(), port.to_string());
    }
    if let Some(seeds) = &args.join {
        flags.insert("LOG_NODES".to_string(), seeds.clone());
    }
    if let Some(host) = &args.advertise_host {
        flags.insert("ADVERTISE_HOST".to_string(), host.clone());
    }
    if let Some(port) = args.gossip_port {
        flags.insert("CLUSTER_GOSSIP_PORT".to_string(), port.to_string());
    }
    if let Some(attributes) = &args.attributes {
        flags.insert("LOG_ATTRIBUTES".to_string(), attributes.clone());
    }
    if let Some(port) = args.dashboard_port {
        flags.insert("DASHBOARD_PORT".to_string(), port.to_string());
    }
    let file = match &args.config {
        Some(path) => read_toml(path)?,
        None => BTreeMap::new(),
    };
    let env = |name: &str| std::env::var(name).ok();
    BrokerConfig::load(&Sources { flags: &flags, env: &env, file: &file })
        .map_err(|error| error.to_string())
}

/// Top-level keys of a TOML settings file, as strings.
fn read_toml(path: &std::path::Path) -> Result<BTreeMap<String, String>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let table: toml::Table =
        text.parse().map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(table
        .into_iter()
        .map(|(key, value)| {
            let value = match value {
                toml::Value::String(text) => text,
                other => other.to_string(),
            };
            (key.to_ascii_lowercase(), value)
        })
        .collect())
}

/// Descriptors kept for everything but segment files: connections, the Raft store, sockets to
/// peers. Segment handles may use what the limit leaves beyond it, up to a third of the limit.
const DESCRIPTORS_RESERVED: u64 = 256;

async fn serve(mut config: BrokerConfig) -> Result<(), String> {
    fit_open_segments_to_descriptors(&mut config);
    let data_dir = config.data_dir.clone();
    let mut generated_token = None;
    let (broker, report, identity, gossip) = if config.cluster.enabled {
        let member = crate::cluster_boot::open_member(config).await?;
        generated_token = member.generated_token;
        (member.broker, member.report, member.identity, Some(member.gossip))
    } else {
        let identity = crate::identity::load_or_create(&data_dir, None, config.node_id)
            .map_err(|error| error.to_string())?;
        let deps = NodeDeps::production(config, identity.node_id);
        let (broker, report) = Broker::open(deps).await.map_err(|error| error.to_string())?;
        (broker, report, identity, None)
    };
    let server = Server::bind(Arc::clone(&broker)).await.map_err(|error| {
        format!("binding {}:{}: {error}", broker.config().bind_address, broker.config().tcp_port)
    })?;
    let address = server.local_addr().map_err(|error| error.to_string())?;
    eprintln!(
        "malachi {} listening on {address}, data in {} (node {}, cluster {})",
        env!("CARGO_PKG_VERSION"),
        data_dir.display(),
        identity.node_id,
        identity.cluster_id
    );
    if let Some(password) = &report.generated_admin_password {
        eprintln!("first boot: the admin password is {password}");
        eprintln!(
            "(stored in {} for the local CLI; shown only this once)",
            data_dir.join("admin.credentials").display()
        );
    }
    if let Some(token) = &generated_token {
        eprintln!("new cluster: the join token is {token}");
        eprintln!(
            "(other brokers join with MALACHI_CLUSTER_TOKEN set to it; stored in {}; shown only \
             this once)",
            data_dir.join("cluster").join("token").display()
        );
    }
    let console = start_console(&broker, server.shared()).await?;
    let maintenance = broker.spawn_maintenance();
    if broker.transport().is_some() {
        // A notice this broker left with the others when it last stopped is withdrawn once it
        // is ready (its Raft groups caught up): until then it is made no head's primary and is
        // handed no leadership.
        let broker = Arc::clone(&broker);
        tokio::spawn(async move {
            broker.observer().catch_up_after_start().await;
            while broker.observer().readiness().is_err() {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            broker.handover().withdraw().await;
        });
    }
    let stop = async {
        let signalled = tokio::select! {
            biased;
            () = wait_for_signal() => true,
            () = commit_failure(&broker) => false,
        };
        if signalled {
            exit_at_once_after(broker.config().shutdown_timeout_ms);
            eprintln!("malachi stopping: handing the work over (a second SIGTERM exits at once)");
            broker.handover().hand_over().await;
        }
    };
    server.run(stop).await;
    if let Some((stop_console, console)) = console {
        let _ = stop_console.send(());
        let _ = console.await;
    }
    maintenance.abort();
    if let Some(gossip) = gossip {
        gossip.leave().await;
    }
    broker.shutdown().await;
    close_journal(&broker).await;
    eprintln!("malachi stopped");
    Ok(())
}

/// Starts the HTTP port (`/health`, `/ready`, `/metrics`, the console) unless it is turned
/// off; the sender stops it.
async fn start_console(
    broker: &Arc<Broker>,
    shared: &Arc<malachi_server::ServerShared>,
) -> Result<Option<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)>, String> {
    let config = broker.config();
    if !config.dashboard.enabled {
        return Ok(None);
    }
    let console = malachi_console::Console::bind(Arc::clone(broker), Arc::clone(shared))
        .await
        .map_err(|error| {
            format!(
                "binding the HTTP port {}:{} (MALACHI_DASHBOARD_PORT): {error}",
                config.bind_address, config.dashboard.port
            )
        })?;
    let address = console.local_addr().map_err(|error| error.to_string())?;
    // Under TLS the port speaks HTTPS too (plain HTTP as well unless MALACHI_REQUIRE_TLS).
    let scheme = if config.security.tls.is_some() { "https" } else { "http" };
    eprintln!("console, /metrics, /health and /ready on {scheme}://{address}");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(console.run(async move {
        let _ = stopped.await;
    }));
    Ok(Some((stop, task)))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (the default soft limit of 1,024 is too
/// few for a broker with many ranges), then caps the open segment files so that they can never
/// take the descriptors that accepting connections needs: a third of them, because the node
/// journal may hold as many again open until its checkpoints sync them.
fn fit_open_segments_to_descriptors(config: &mut BrokerConfig) {
    let descriptors = match raise_descriptor_limit() {
        Ok(descriptors) => descriptors,
        Err(error) => {
            tracing::warn!(%error, "could not read or raise the descriptor limit");
            return;
        }
    };
    let for_segments = (descriptors / 3).min(descriptors.saturating_sub(DESCRIPTORS_RESERVED));
    let for_segments = u32::try_from(for_segments).unwrap_or(u32::MAX).max(16);
    if config.max_open_segments > for_segments {
        tracing::warn!(
            descriptors,
            configured = config.max_open_segments,
            used = for_segments,
            "MALACHI_MAX_OPEN_SEGMENTS lowered to fit the descriptor limit"
        );
        config.max_open_segments = for_segments;
    }
}

/// The soft descriptor limit after raising it as far as the hard limit allows.
fn raise_descriptor_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}

/// Resolves if the group commit stops taking writes (a journal checkpoint failed on storage):
/// the broker then stops, as it must not go on with segment files whose acknowledged bytes the
/// disk may have dropped; a restart replays the journal and restores them.
async fn commit_failure(broker: &Broker) {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        if broker.data_plane().commit_failed() {
            tracing::error!(
                "a journal checkpoint failed on storage: stopping; a restart replays the journal"
            );
            return;
        }
    }
}

/// Empties the node journal at a clean stop, so the next start replays nothing: a rolling
/// restart's broker is back sooner (a full journal took seconds to replay in a container).
async fn close_journal(broker: &Arc<Broker>) {
    if broker.config().group_commit_barrier != malachi_broker::data::Barrier::Journal {
        return;
    }
    let closing = Arc::clone(broker);
    let closed = tokio::task::spawn_blocking(move || closing.data_plane().checkpoint_at_close());
    if !matches!(closed.await, Ok(true)) {
        tracing::warn!("the node journal was not emptied at the stop: the next start replays it");
    }
}

/// From the first SIGTERM on, a second one, or `timeout_ms` (`MALACHI_SHUTDOWN_TIMEOUT_MS`),
/// ends the process at once: what it acknowledged is on disk already, so exiting without the
/// rest of the hand-over is a crash, which the cluster recovers from.
fn exit_at_once_after(timeout_ms: u64) {
    tokio::spawn(async move {
        let cause = tokio::select! {
            () = wait_for_signal() => "a second signal",
            () = tokio::time::sleep(std::time::Duration::from_millis(timeout_ms)) => {
                "MALACHI_SHUTDOWN_TIMEOUT_MS passed"
            }
        };
        eprintln!("malachi: {cause}: exiting at once");
        std::process::exit(1);
    });
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
