//! The client commands: topic, produce, consume, group, user, acl, policy, cluster. Each connects with
//! `malachi-client`, does one job and prints plain text (or JSON lines for `consume --json`).
//!
//! Failures come back as one line: what was being done, the server's reason text as sent, and
//! a hint where one helps (`no_such_topic (create it with ...)`). `main.rs` prints it and exits
//! non-zero.

mod cluster;
mod consume;
mod group;
mod output;
mod policy;
mod produce;
pub(crate) mod settings;
mod topic;
mod users;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Subcommand;
use malachi_client::{Client, ClientError, Reason};

use settings::{ConnectionArgs, LoginSource, Settings};

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Create, list, describe, delete, split and merge topics.
    Topic(topic::TopicArgs),
    /// Append records: the values given, or one record per line of standard input.
    Produce(produce::ProduceArgs),
    /// Print a topic's records, one value per line (or JSON lines).
    Consume(consume::ConsumeArgs),
    /// Create, delete and list users, change passwords (admin).
    User(users::UserArgs),
    /// Grant, revoke and list a user's ACL grants (admin).
    Acl(users::AclArgs),
    /// Define storage policies and bind them to topics (admin).
    Policy(policy::PolicyArgs),
    /// The cluster's brokers and Raft groups (admin).
    Cluster(cluster::ClusterArgs),
    /// Consumer groups and their lag.
    Group(group::GroupArgs),
}

pub fn run(command: ClientCommand) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the async runtime: {error}"))?;
    runtime.block_on(async move {
        match command {
            ClientCommand::Topic(args) => topic::run(args).await,
            ClientCommand::Produce(args) => produce::run(args).await,
            ClientCommand::Consume(args) => consume::run(args).await,
            ClientCommand::User(args) => users::run_user(args).await,
            ClientCommand::Acl(args) => users::run_acl(args).await,
            ClientCommand::Policy(args) => policy::run(args).await,
            ClientCommand::Cluster(args) => cluster::run(args).await,
            ClientCommand::Group(args) => group::run(args).await,
        }
    })
}

/// A logged-in connection and what is needed to explain its failures.
pub(crate) struct Session {
    /// Shared so that pipelined requests can run as separate tasks.
    pub client: Arc<Client>,
    context: Context,
}

/// What an error message may mention.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Context {
    server: String,
    user: String,
    /// Set when the login came from the local broker's credentials file.
    local_admin: Option<PathBuf>,
}

impl Session {
    pub(crate) async fn connect(args: &ConnectionArgs) -> Result<Session, String> {
        let settings = Settings::load(args)?;
        let context = Context::of(&settings);
        match Client::connect(settings.client_config()).await {
            Ok(client) => Ok(Session { client: Arc::new(client), context }),
            Err(error) => Err(explain("login", None, &error, &context)),
        }
    }

    /// The one-line message for `error` while doing `action`.
    pub(crate) fn fail(&self, action: &str, error: &ClientError) -> String {
        explain(action, None, error, &self.context)
    }

    /// As [`Session::fail`], for an action on `topic` (hints may name it).
    pub(crate) fn fail_on(&self, action: &str, topic: &str, error: &ClientError) -> String {
        explain(action, Some(topic), error, &self.context)
    }
}

impl Settings {
    /// The one-line message for `error` while doing `action` with these settings.
    pub(crate) fn explain(&self, action: &str, topic: Option<&str>, error: &ClientError) -> String {
        explain(action, topic, error, &Context::of(self))
    }
}

impl Context {
    fn of(settings: &Settings) -> Context {
        let local_admin = match &settings.login {
            LoginSource::Given => None,
            LoginSource::LocalAdmin(path) => Some(path.clone()),
        };
        Context { server: settings.server.clone(), user: settings.user.clone(), local_admin }
    }
}

/// `action: what went wrong (hint)`.
fn explain(action: &str, topic: Option<&str>, error: &ClientError, context: &Context) -> String {
    let server = &context.server;
    match error {
        ClientError::Transport(io_error) if io_error.kind() == io::ErrorKind::ConnectionRefused => {
            format!(
                "cannot reach {server}: connection refused (is `malachi serve` running there? \
                 --server or MALACHI_SERVER names another broker)"
            )
        }
        ClientError::Transport(io_error) => format!("{action}: {server}: {io_error}"),
        ClientError::Timeout => format!("{action}: no answer from {server} in time"),
        ClientError::Closed => format!("{action}: {server} closed the connection"),
        ClientError::Protocol(detail) => {
            format!("{action}: {detail} (is {server} a Malachi broker? over TLS, pass --tls)")
        }
        ClientError::Tls(detail) => format!("{action}: {detail}"),
        ClientError::Server { reason, retryable } => {
            let hint = error.reason().and_then(|known| hint(known, topic, context));
            let hint = hint.or_else(|| retryable.then(|| "temporary; try again".to_string()));
            match hint {
                Some(hint) => format!("{action}: {reason} ({hint})"),
                None => format!("{action}: {reason}"),
            }
        }
    }
}

fn hint(reason: Reason, topic: Option<&str>, context: &Context) -> Option<String> {
    let topic = topic.unwrap_or("TOPIC");
    let text = match reason {
        Reason::InvalidCredentials => match &context.local_admin {
            Some(path) => format!(
                "{} does not match the broker at {}; pass --user and --password",
                path.display(),
                context.server
            ),
            None => "check --user/--password, MALACHI_USER/MALACHI_PASSWORD or the profile".into(),
        },
        Reason::AccountLocked => "too many failed logins; wait before trying again".into(),
        Reason::RateLimitExceeded => "too many logins from this address; wait a minute".into(),
        Reason::TlsRequired => "the broker accepts TLS only; pass --tls (and --ca)".into(),
        Reason::NoPeerCertificate => {
            "pass --client-cert and --client-key with a certificate the broker trusts".into()
        }
        Reason::MtlsAuthUnavailable => {
            "certificate login needs TLS with MALACHI_TLS_VERIFY=verify_peer on the broker".into()
        }
        Reason::PermissionDenied => format!(
            "user {} may not do this; an admin can grant it with `malachi acl grant` or \
             `malachi user create --perm`",
            context.user
        ),
        Reason::NoSuchTopic => format!("create it with `malachi topic create {topic}`"),
        Reason::AlreadyExists => "the topic exists already; `malachi topic list` shows them".into(),
        Reason::InvalidTopicName => "names use letters, digits, '.', '_' and '-'".into(),
        Reason::UnknownApiKey => {
            "the broker does not serve this command; it may be an older version".into()
        }
        Reason::InvalidCursor => "the cursor is not from this broker; start without it".into(),
        Reason::PolicyInUse => "unbind those topics first, or delete with --force".into(),
        Reason::NoSuchPolicy => "`malachi policy list` shows the defined policies".into(),
        Reason::UserExists => "`malachi user passwd` changes an existing user's password".into(),
        Reason::UserNotFound => "`malachi user list` shows the users".into(),
        Reason::InvalidPermissions => "permissions are admin, produce and consume".into(),
        Reason::InvalidRangeCount => "--ranges must be a power of two".into(),
        Reason::NotBuddies => format!(
            "only the two halves of one split merge back; `malachi topic describe {topic}` \
             shows them"
        ),
        Reason::NoSuchRange | Reason::RangeSealed => format!(
            "only active ranges split or merge; `malachi topic describe {topic}` lists them"
        ),
        Reason::DiskFull => "free space on the broker's data disk".into(),
        Reason::StorageFailed => "the broker's storage failed; see its log".into(),
        Reason::NoSuchBroker => "`malachi cluster status` lists the brokers".into(),
        Reason::BrokerHoldsSegments => {
            "its sealed segments have no other copy; --force removes it with them".into()
        }
        Reason::CannotRemoveSelf => "send it through another broker (--server)".into(),
        _ => return None,
    };
    Some(text)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// The client commands as `main.rs` mounts them.
    #[derive(Parser, Debug)]
    struct Mounted {
        #[command(subcommand)]
        command: ClientCommand,
    }

    #[test]
    fn command_lines_parse() {
        Mounted::command().debug_assert();
        let lines: &[&str] = &[
            "topic create orders --ranges 4",
            "topic --server 127.0.0.1:4040 list",
            "topic list --server 127.0.0.1:4040 --user app --password pw",
            "topic split orders 0",
            "topic merge orders 1 2",
            "produce orders hello world --key k1 --header a=1 --header b=2",
            "produce orders --keys-from-line : --batch-records 500",
            "consume orders --group g1 --member m1 --follow --json --max 10",
            "consume orders --from-start --group g1",
            "user create bob --password secret --perm produce,consume",
            "user --user admin --password admin-pw passwd bob --password new-secret",
            "user list",
            "acl grant bob produce orders*",
            "acl list bob",
            "policy define short --max-age-ms 60000 --max-bytes off --spread-by rack",
            "policy delete short --force",
            "policy bind orders short",
            "policy unbind orders",
            "policy get orders",
            "cluster status --server 127.0.0.1:4140",
            "cluster remove 3 --force",
        ];
        for line in lines {
            let words = std::iter::once("malachi").chain(line.split_whitespace());
            if let Err(error) = Mounted::try_parse_from(words) {
                panic!("{line}: {error}");
            }
        }
        // A positional USER must not be taken for the login user (--user).
        let words = ["malachi", "acl", "grant", "bob", "produce", "orders*"];
        let Mounted { command: ClientCommand::Acl(acl) } = Mounted::parse_from(words) else {
            panic!("an acl command");
        };
        assert_eq!(acl.login_user(), None);
        let refused: &[&str] = &[
            "consume orders --member m1",
            "acl grant bob publish orders",
            "produce orders --header novalue",
            "user create bob --password p --perm superuser",
        ];
        for line in refused {
            let words = std::iter::once("malachi").chain(line.split_whitespace());
            assert!(Mounted::try_parse_from(words).is_err(), "{line}");
        }
    }

    fn context(local_admin: Option<&str>) -> Context {
        Context {
            server: "127.0.0.1:4040".into(),
            user: "app".into(),
            local_admin: local_admin.map(PathBuf::from),
        }
    }

    #[test]
    fn errors_become_one_line_with_a_hint() {
        let server = |reason: &str| ClientError::server(reason.as_bytes());
        let refused = ClientError::Transport(io::ErrorKind::ConnectionRefused.into());
        let cases: &[(ClientError, Option<&str>, Option<&str>, &str)] = &[
            (
                server("no_such_topic"),
                Some("orders"),
                None,
                "produce: no_such_topic (create it with `malachi topic create orders`)",
            ),
            (
                server("permission_denied"),
                None,
                None,
                "produce: permission_denied (user app may not do this; an admin can grant it \
                 with `malachi acl grant` or `malachi user create --perm`)",
            ),
            (
                server("invalid_credentials"),
                None,
                Some("malachi-data/admin.credentials"),
                "produce: invalid_credentials (malachi-data/admin.credentials does not match \
                 the broker at 127.0.0.1:4040; pass --user and --password)",
            ),
            (server("not_owner"), None, None, "produce: not_owner (temporary; try again)"),
            (server("something_new"), None, None, "produce: something_new"),
            (
                refused,
                None,
                None,
                "cannot reach 127.0.0.1:4040: connection refused (is `malachi serve` running \
                 there? --server or MALACHI_SERVER names another broker)",
            ),
            (ClientError::Timeout, None, None, "produce: no answer from 127.0.0.1:4040 in time"),
        ];
        for (error, topic, local_admin, expected) in cases {
            let line = explain("produce", *topic, error, &context(*local_admin));
            assert_eq!(line, *expected);
            assert!(!line.contains('\n'));
        }
    }
}
