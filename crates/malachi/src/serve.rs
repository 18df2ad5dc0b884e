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
    /// This node's id in the cluster.
    #[arg(long, default_value_t = 1)]
    node_id: u64,
}

pub fn run(args: ServeArgs) -> Result<(), String> {
    init_tracing();
    let config = load_config(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("starting the runtime: {error}"))?;
    runtime.block_on(serve(config, args.node_id))
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
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

async fn serve(config: BrokerConfig, node_id: u64) -> Result<(), String> {
    let data_dir = config.data_dir.clone();
    let deps = NodeDeps::production(config, node_id);
    let (broker, report) = Broker::open(deps).await.map_err(|error| error.to_string())?;
    let server = Server::bind(Arc::clone(&broker)).await.map_err(|error| {
        format!("binding {}:{}: {error}", broker.config().bind_address, broker.config().tcp_port)
    })?;
    let address = server.local_addr().map_err(|error| error.to_string())?;
    eprintln!(
        "malachi {} listening on {address}, data in {}",
        env!("CARGO_PKG_VERSION"),
        data_dir.display()
    );
    if let Some(password) = &report.generated_admin_password {
        eprintln!("first boot: the admin password is {password}");
        eprintln!(
            "(stored in {} for the local CLI; shown only this once)",
            data_dir.join("admin.credentials").display()
        );
    }
    let maintenance = broker.spawn_maintenance();
    server.run(wait_for_signal()).await;
    maintenance.abort();
    broker.shutdown().await;
    eprintln!("malachi stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
