//! Where the client commands connect and as whom: flags, then `MALACHI_*` environment variables,
//! then a TOML profile, then defaults (flag > environment > profile > default, per setting).
//!
//! With no user from any of those and a server on this machine, the commands log in with the
//! local broker's bootstrap admin, read from `admin.credentials` in its data directory
//! (`MALACHI_LOG_DATA_DIR`, else `./malachi-data`, as `malachi serve` uses): so `malachi serve`
//! in one terminal and `malachi produce orders hello` in another, from the same directory, just
//! works. Resolution is pure ([`resolve`]); only [`Settings::load`] reads the environment and
//! files.

use std::path::{Path, PathBuf};

use malachi_client::{ClientConfig, TlsOptions};
use serde::Deserialize;

/// The address used when none is given.
pub const SERVER_DEFAULT: &str = "127.0.0.1:4040";
/// The profile read when `--profile` is not given, relative to the home directory.
const PROFILE_DEFAULT: &str = ".config/malachi/client.toml";
const DATA_DIR_DEFAULT: &str = "malachi-data";

/// Connection flags shared by every client command.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConnectionArgs {
    /// Broker address [env: MALACHI_SERVER] [default: 127.0.0.1:4040].
    #[arg(long, global = true, value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// User to log in as [env: MALACHI_USER] [default: the local broker's admin].
    #[arg(long, global = true, value_name = "NAME")]
    pub user: Option<String>,
    /// Password of --user [env: MALACHI_PASSWORD].
    #[arg(long, global = true, value_name = "PASSWORD")]
    pub password: Option<String>,
    /// TOML file with `server`, `user`, `password` [default: ~/.config/malachi/client.toml,
    /// if it exists].
    #[arg(long, global = true, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Speak TLS to the broker [env: MALACHI_TLS]; implied by --ca and --client-cert.
    #[arg(long, global = true)]
    pub tls: bool,
    /// PEM CA bundle the broker's certificate must chain to [env: MALACHI_TLS_CA] [default:
    /// the system's bundle].
    #[arg(long, global = true, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain for mTLS [env: MALACHI_TLS_CERT]; without --user, logs in
    /// as the user the certificate names.
    #[arg(long, global = true, value_name = "FILE")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert [env: MALACHI_TLS_KEY].
    #[arg(long, global = true, value_name = "FILE")]
    pub client_key: Option<PathBuf>,
    /// Log in with this JWT instead of a password [env: MALACHI_TOKEN].
    #[arg(long, global = true, value_name = "JWT")]
    pub token: Option<String>,
}

/// The same flags, valid only before the subcommand: `malachi user` uses them because its own
/// subcommands take `--password` for the user being created or changed
/// (`malachi user --password ADMIN_PW create bob --password BOB_PW`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LeadingConnectionArgs {
    /// Broker address [env: MALACHI_SERVER] [default: 127.0.0.1:4040].
    #[arg(long, value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// User to log in as [env: MALACHI_USER] [default: the local broker's admin].
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Password of --user [env: MALACHI_PASSWORD].
    #[arg(long, value_name = "PASSWORD")]
    pub password: Option<String>,
    /// TOML file with `server`, `user`, `password` [default: ~/.config/malachi/client.toml,
    /// if it exists].
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Speak TLS to the broker [env: MALACHI_TLS]; implied by --ca and --client-cert.
    #[arg(long)]
    pub tls: bool,
    /// PEM CA bundle the broker's certificate must chain to [env: MALACHI_TLS_CA] [default:
    /// the system's bundle].
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain for mTLS [env: MALACHI_TLS_CERT]; without --user, logs in
    /// as the user the certificate names.
    #[arg(long, value_name = "FILE")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert [env: MALACHI_TLS_KEY].
    #[arg(long, value_name = "FILE")]
    pub client_key: Option<PathBuf>,
    /// Log in with this JWT instead of a password [env: MALACHI_TOKEN].
    #[arg(long, value_name = "JWT")]
    pub token: Option<String>,
}

impl From<LeadingConnectionArgs> for ConnectionArgs {
    fn from(args: LeadingConnectionArgs) -> ConnectionArgs {
        let LeadingConnectionArgs {
            server,
            user,
            password,
            profile,
            tls,
            ca,
            client_cert,
            client_key,
            token,
        } = args;
        ConnectionArgs { server, user, password, profile, tls, ca, client_cert, client_key, token }
    }
}

/// Settings from one source; any may be missing.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    pub server: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub tls: Option<bool>,
    pub ca: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub token: Option<String>,
}

/// Where the login came from, for error hints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoginSource {
    Given,
    /// The local broker's `admin.credentials`, at this path.
    LocalAdmin(PathBuf),
}

/// How the resolved settings log in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Method {
    /// `user` and `password` (key 0).
    Password,
    /// The client certificate (key 12).
    Certificate,
    /// A JWT (key 13).
    Token(String),
}

/// The resolved settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub server: String,
    /// The user for a password login; for the others, how the login is described.
    pub user: String,
    pub password: String,
    pub login: LoginSource,
    pub method: Method,
    pub tls: Option<TlsOptions>,
}

impl Settings {
    /// Reads the environment, the profile and, if needed, the local admin credentials.
    pub fn load(args: &ConnectionArgs) -> Result<Settings, String> {
        let environment = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let flags = Layer {
            server: args.server.clone(),
            user: args.user.clone(),
            password: args.password.clone(),
            tls: args.tls.then_some(true),
            ca: args.ca.clone(),
            client_cert: args.client_cert.clone(),
            client_key: args.client_key.clone(),
            token: args.token.clone(),
        };
        let env_layer = Layer {
            server: environment("MALACHI_SERVER"),
            user: environment("MALACHI_USER"),
            password: environment("MALACHI_PASSWORD"),
            tls: environment("MALACHI_TLS").map(|value| matches!(value.as_str(), "1" | "true")),
            ca: environment("MALACHI_TLS_CA").map(PathBuf::from),
            client_cert: environment("MALACHI_TLS_CERT").map(PathBuf::from),
            client_key: environment("MALACHI_TLS_KEY").map(PathBuf::from),
            token: environment("MALACHI_TOKEN"),
        };
        let home = environment("HOME").map(PathBuf::from);
        let profile = load_profile(args.profile.as_deref(), home.as_deref())?;
        let data_dir = environment("MALACHI_LOG_DATA_DIR").unwrap_or(DATA_DIR_DEFAULT.into());
        resolve(&[flags, env_layer, profile], |server| local_admin(server, Path::new(&data_dir)))
    }

    pub fn client_config(&self) -> ClientConfig {
        let config = ClientConfig::new(self.server.clone());
        let config = match &self.method {
            Method::Password => config.credentials(&self.user, &self.password),
            Method::Certificate => config.certificate_login(),
            Method::Token(jwt) => config.token_login(jwt.clone()),
        };
        match &self.tls {
            Some(options) => config.tls(options.clone()),
            None => config,
        }
    }
}

/// Merges `layers` (highest precedence first) over the defaults. Without a user in any layer,
/// asks `local_admin` for the credentials of a broker on this machine.
pub fn resolve(
    layers: &[Layer],
    local_admin: impl FnOnce(&str) -> Result<(String, String, PathBuf), String>,
) -> Result<Settings, String> {
    let first = |pick: fn(&Layer) -> &Option<String>| layers.iter().find_map(|l| pick(l).clone());
    let server = first(|layer| &layer.server).unwrap_or_else(|| SERVER_DEFAULT.to_string());
    let tls = tls_options(layers)?;
    let given = |user: &str, password: String, method: Method| Settings {
        server: server.clone(),
        user: user.to_string(),
        password,
        login: LoginSource::Given,
        method,
        tls: tls.clone(),
    };
    let has_certificate = tls.as_ref().is_some_and(|tls| tls.client_certificate.is_some());
    match (first(|layer| &layer.user), first(|layer| &layer.password)) {
        _ if first(|layer| &layer.token).is_some() => {
            let jwt = first(|layer| &layer.token).unwrap_or_default();
            Ok(given("(token)", String::new(), Method::Token(jwt)))
        }
        (Some(user), Some(password)) => Ok(given(&user, password, Method::Password)),
        (None, None) if has_certificate => {
            Ok(given("(client certificate)", String::new(), Method::Certificate))
        }
        (Some(user), None) => Err(format!(
            "no password for user {user}: pass --password, set MALACHI_PASSWORD or add it to \
             the profile"
        )),
        (None, _) => {
            let (user, password, path) = local_admin(&server)?;
            let login = LoginSource::LocalAdmin(path);
            Ok(Settings { server, user, password, login, method: Method::Password, tls })
        }
    }
}

/// TLS if any layer turns it on or names a CA or client certificate; a certificate needs its
/// key.
fn tls_options(layers: &[Layer]) -> Result<Option<TlsOptions>, String> {
    let first = |pick: fn(&Layer) -> &Option<PathBuf>| layers.iter().find_map(|l| pick(l).clone());
    let (ca, cert, key) = (first(|l| &l.ca), first(|l| &l.client_cert), first(|l| &l.client_key));
    let on = layers.iter().find_map(|layer| layer.tls).unwrap_or(false);
    if !on && ca.is_none() && cert.is_none() {
        return Ok(None);
    }
    let client_certificate = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) => {
            return Err("--client-cert needs --client-key (or MALACHI_TLS_KEY)".into());
        }
        (None, Some(_)) => {
            return Err("--client-key needs --client-cert (or MALACHI_TLS_CERT)".into());
        }
    };
    Ok(Some(TlsOptions { ca_file: ca, client_certificate, server_name: None }))
}

/// Whether `server` (`host:port`) names this machine.
pub fn is_local(server: &str) -> bool {
    let host = server.rsplit_once(':').map_or(server, |(host, _)| host);
    matches!(host, "127.0.0.1" | "localhost" | "::1" | "[::1]")
}

/// The bootstrap admin of a broker on this machine whose data directory is `data_dir`.
fn local_admin(server: &str, data_dir: &Path) -> Result<(String, String, PathBuf), String> {
    let hint = "pass --user and --password (or set MALACHI_USER and MALACHI_PASSWORD)";
    if !is_local(server) {
        return Err(format!("no user given for {server}: {hint}"));
    }
    let path = malachi_broker::auth::admin_credentials_path(data_dir);
    match malachi_broker::auth::read_admin_credentials(data_dir) {
        Ok((user, password)) => Ok((user, password, path)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "no user given and no {} (run this from the directory where `malachi serve` runs, \
             set MALACHI_LOG_DATA_DIR, or {hint})",
            path.display()
        )),
        Err(error) => Err(format!("cannot read {}: {error}; {hint}", path.display())),
    }
}

/// The profile: `explicit` must exist; the default one is read only if it does.
fn load_profile(explicit: Option<&Path>, home: Option<&Path>) -> Result<Layer, String> {
    let path = match (explicit, home) {
        (Some(path), _) => path.to_path_buf(),
        (None, Some(home)) => {
            let path = home.join(PROFILE_DEFAULT);
            if !path.exists() {
                return Ok(Layer::default());
            }
            path
        }
        (None, None) => return Ok(Layer::default()),
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|error| format!("cannot read profile {}: {error}", path.display()))?;
    parse_profile(&text).map_err(|error| format!("profile {}: {error}", path.display()))
}

fn parse_profile(text: &str) -> Result<Layer, String> {
    toml::from_str(text).map_err(|error| error.message().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(server: Option<&str>, user: Option<&str>, password: Option<&str>) -> Layer {
        Layer {
            server: server.map(str::to_string),
            user: user.map(str::to_string),
            password: password.map(str::to_string),
            ..Layer::default()
        }
    }

    fn no_local_admin(_: &str) -> Result<(String, String, PathBuf), String> {
        Err("no local admin".into())
    }

    /// (flags, environment, profile) and the resulting (server, user, password).
    type PrecedenceCase = ([Layer; 3], (&'static str, &'static str, &'static str));

    #[test]
    fn each_setting_takes_the_first_layer_that_has_it() {
        let none = Layer::default();
        let cases: &[PrecedenceCase] = &[
            (
                [layer(Some("f:1"), Some("fu"), Some("fp")), none.clone(), none.clone()],
                ("f:1", "fu", "fp"),
            ),
            (
                [
                    layer(None, Some("fu"), None),
                    layer(Some("e:1"), Some("eu"), Some("ep")),
                    layer(Some("p:1"), Some("pu"), Some("pp")),
                ],
                ("e:1", "fu", "ep"),
            ),
            (
                [none.clone(), none.clone(), layer(Some("p:1"), Some("pu"), Some("pp"))],
                ("p:1", "pu", "pp"),
            ),
            (
                [none.clone(), layer(None, Some("eu"), Some("ep")), none.clone()],
                (SERVER_DEFAULT, "eu", "ep"),
            ),
        ];
        for (layers, (server, user, password)) in cases {
            let settings = resolve(layers, no_local_admin).expect("resolves");
            assert_eq!(
                (settings.server.as_str(), settings.user.as_str(), settings.password.as_str()),
                (*server, *user, *password),
                "{layers:?}"
            );
            assert_eq!(settings.login, LoginSource::Given);
        }
    }

    #[test]
    fn without_a_user_the_local_admin_logs_in() {
        let local = |server: &str| {
            assert_eq!(server, SERVER_DEFAULT);
            Ok(("admin".to_string(), "secret".to_string(), PathBuf::from("d/admin.credentials")))
        };
        let settings = resolve(&[Layer::default()], local).expect("resolves");
        assert_eq!((settings.user.as_str(), settings.password.as_str()), ("admin", "secret"));
        assert_eq!(settings.login, LoginSource::LocalAdmin("d/admin.credentials".into()));
        let error = resolve(&[layer(None, Some("bob"), None)], no_local_admin).unwrap_err();
        assert!(error.starts_with("no password for user bob"), "{error}");
        let error = resolve(&[Layer::default()], no_local_admin).unwrap_err();
        assert_eq!(error, "no local admin");
    }

    #[test]
    fn local_servers() {
        let cases = [
            ("127.0.0.1:4040", true),
            ("localhost:1", true),
            ("[::1]:4040", true),
            ("10.0.0.5:4040", false),
            ("broker.example:4040", false),
        ];
        for (server, local) in cases {
            assert_eq!(is_local(server), local, "{server}");
        }
        let error = local_admin("10.0.0.5:4040", Path::new("nowhere")).unwrap_err();
        assert!(error.starts_with("no user given for 10.0.0.5:4040"), "{error}");
    }

    #[test]
    fn local_admin_reads_the_brokers_credentials_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = local_admin(SERVER_DEFAULT, dir.path()).unwrap_err();
        assert!(missing.contains("admin.credentials"), "{missing}");
        malachi_broker::auth::write_admin_credentials(dir.path(), "admin", "pw").expect("writes");
        let (user, password, path) = local_admin(SERVER_DEFAULT, dir.path()).expect("reads");
        assert_eq!((user.as_str(), password.as_str()), ("admin", "pw"));
        assert_eq!(path, dir.path().join("admin.credentials"));
    }

    #[test]
    fn tls_and_login_methods_resolve() {
        let path = |name: &str| Some(PathBuf::from(name));
        let tls_layer = |client_cert, client_key, token: Option<&str>| Layer {
            ca: path("ca.pem"),
            client_cert,
            client_key,
            token: token.map(str::to_string),
            ..Layer::default()
        };
        let certified = resolve(&[tls_layer(path("c"), path("k"), None)], no_local_admin).unwrap();
        assert_eq!(certified.method, Method::Certificate, "a certificate without a user");
        let options = certified.tls.expect("TLS is implied by --ca");
        assert_eq!(options.client_certificate, Some(("c".into(), "k".into())));
        let by_token = resolve(&[tls_layer(None, None, Some("jwt"))], no_local_admin).unwrap();
        assert_eq!(by_token.method, Method::Token("jwt".into()));
        let user = Layer { user: Some("u".into()), password: Some("p".into()), ..Layer::default() };
        let with_user = [user.clone(), tls_layer(path("c"), path("k"), None)];
        assert_eq!(resolve(&with_user, no_local_admin).unwrap().method, Method::Password);
        assert_eq!(resolve(&[user], no_local_admin).unwrap().tls, None, "plain by default");
        let half = resolve(&[tls_layer(path("c"), None, None)], no_local_admin).unwrap_err();
        assert!(half.starts_with("--client-cert needs --client-key"), "{half}");
        let parsed =
            parse_profile("tls = true\nclient_cert = \"c\"\nclient_key = \"k\"\n").unwrap();
        assert_eq!((parsed.tls, parsed.client_key), (Some(true), path("k")));
    }

    #[test]
    fn profiles() {
        let parsed = parse_profile("server = \"b:4040\"\nuser = \"app\"\npassword = \"x\"\n");
        assert_eq!(parsed, Ok(layer(Some("b:4040"), Some("app"), Some("x"))));
        assert_eq!(parse_profile(""), Ok(Layer::default()));
        assert!(parse_profile("sever = \"typo\"").is_err(), "unknown keys are refused");
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(load_profile(None, Some(dir.path())), Ok(Layer::default()), "optional");
        let missing = dir.path().join("nope.toml");
        assert!(load_profile(Some(&missing), None).is_err(), "an explicit profile must exist");
        let config = dir.path().join(PROFILE_DEFAULT);
        std::fs::create_dir_all(config.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(&config, "user = \"app\"").expect("writes");
        let loaded = load_profile(None, Some(dir.path()));
        assert_eq!(loaded, Ok(layer(None, Some("app"), None)));
    }
}
