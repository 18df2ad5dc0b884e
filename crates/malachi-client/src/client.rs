//! [`Client`]: connect, authenticate, and one typed method per api key.
//!
//! Every method takes `&self`, so one client can be shared (behind an `Arc`) by many tasks whose
//! requests then travel pipelined on its one connection. Strings the caller passes become
//! present wire `str`s; strings the server returns are decoded as UTF-8, lossily (the server
//! mints ASCII). Records, cursors and policy shapes are the wire crate's own types.
//!
//! A broker closes a connection that sends nothing for 30 s (wire-protocol.md section 1.5;
//! subscriptions excepted). A client idle longer finds its calls failing with the close's
//! cause and should connect again: this crate never reconnects on its own.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use malachi_wire::limits::{FRAME_BYTES_MAX_DEFAULT, INFLATED_BATCH_BYTES_MAX_DEFAULT};
use malachi_wire::messages::*;
use malachi_wire::shapes::{Accept, Start};
use malachi_wire::{BatchLimits, PositionedEntry};
use malachi_wire::{PolicyField, Record, Request, Response};
use tokio::net::TcpStream;

use crate::connection::{Connection, StreamReader, StreamWriter};
use crate::error::ClientError;
use crate::subscription::Subscription;
use crate::tls::TlsOptions;

/// Where to connect and how long to wait.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port`, resolved at connect time.
    pub address: String,
    /// Sent as the first frame (key 0, 12 or 13). `None` sends no auth: the server will then
    /// refuse the first request with `auth_required` and close.
    pub credentials: Option<Credentials>,
    /// Speak TLS (`None`: plain TCP).
    pub tls: Option<TlsOptions>,
    /// Bounds the TCP connect and the auth exchange together.
    pub connect_timeout: Duration,
    /// Bounds each request from queueing to answer; a fetch adds its `wait_ms`.
    pub request_timeout: Duration,
    /// Largest frame sent or accepted (section 1.2).
    pub max_frame_bytes: u32,
}

/// How the client logs in.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Key 0: a username and password.
    Password { username: String, password: String },
    /// Key 12: the broker takes the user from the client certificate presented over TLS
    /// ([`TlsOptions::client_certificate`]).
    Certificate,
    /// Key 13: a JWT the broker checks against its issuer's public key.
    Token(String),
}

/// Options of a fetch (key 3). Zero `max` lets the server choose (100); zero `wait_ms` answers
/// at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchOptions {
    /// Continue from this cursor; `None` starts from the group's position or the beginning.
    pub cursor: Option<Bytes>,
    pub group: Option<String>,
    /// With `group`: a group-member fetch, which reads only this member's ranges from the
    /// group's committed positions (the cursor is then ignored by the server).
    pub member: Option<String>,
    /// Records per range read.
    pub max: u32,
    /// Long-poll up to this long when nothing is new (the server caps it at 30,000).
    pub wait_ms: u32,
}

/// Options of a subscription (key 5). Zero `window` or `max` lets the server choose (100).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscribeOptions {
    pub group: Option<String>,
    pub member: Option<String>,
    /// Records pushed but not yet acknowledged.
    pub window: u32,
    /// Records per push.
    pub max: u32,
}

/// A user and its permissions (key 11).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub username: String,
    pub permissions: Vec<String>,
}

/// One ACL grant (key 16).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    pub operation: String,
    pub resource: String,
}

/// An authenticated connection to a broker.
#[derive(Debug)]
pub struct Client {
    connection: Connection,
    config: ClientConfig,
    token: Option<String>,
}

/// `keyspace_bits` sent with `create_topic`; Malachi's own tests send 8, and the server ignores
/// it (wire-protocol.md section 7 item 1).
const CREATE_TOPIC_KEYSPACE_BITS: u8 = 8;

/// How long `drain_broker` waits for its answer.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(150);

macro_rules! call {
    ($client:expr, $variant:ident($request:expr)) => {
        match $client.request(Request::$variant($request)).await? {
            Response::$variant(answer) => answer,
            other => return Err(unexpected(other)),
        }
    };
}

impl ClientConfig {
    /// Defaults: no credentials, 10 s to connect, 30 s per request, 16 MiB frames.
    pub fn new(address: impl Into<String>) -> ClientConfig {
        ClientConfig {
            address: address.into(),
            credentials: None,
            tls: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_frame_bytes: FRAME_BYTES_MAX_DEFAULT,
        }
    }

    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials =
            Some(Credentials::Password { username: username.into(), password: password.into() });
        self
    }

    /// Logs in with the client certificate (key 12); needs [`ClientConfig::tls`] with one.
    pub fn certificate_login(mut self) -> Self {
        self.credentials = Some(Credentials::Certificate);
        self
    }

    /// Logs in with a JWT (key 13).
    pub fn token_login(mut self, jwt: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::Token(jwt.into()));
        self
    }

    /// Speaks TLS with these options.
    pub fn tls(mut self, options: TlsOptions) -> Self {
        self.tls = Some(options);
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Password { username, .. } => formatter
                .debug_struct("Password")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            Credentials::Certificate => formatter.write_str("Certificate"),
            Credentials::Token(_) => formatter.write_str("Token(<redacted>)"),
        }
    }
}

impl Client {
    /// Connects and authenticates. A refused login is [`ClientError::Server`] with the reason
    /// (`invalid_credentials`, `account_locked`, ...); the server has then closed the socket.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        let connect_timeout = config.connect_timeout;
        tokio::time::timeout(connect_timeout, Client::connect_unbounded(config))
            .await
            .unwrap_or(Err(ClientError::Timeout))
    }

    async fn connect_unbounded(config: ClientConfig) -> Result<Client, ClientError> {
        if let Some(tls) = &config.tls {
            let stream = tls.connect(&config.address).await?;
            let (read, write) = tokio::io::split(stream);
            return Client::handshake(config, Box::new(read), Box::new(write)).await;
        }
        let stream = TcpStream::connect(&config.address).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        Client::handshake(config, Box::new(read), Box::new(write)).await
    }

    /// Authenticates over an already open byte stream (`config.address` is then only a label):
    /// the simulator's connections, or a transport the caller set up itself.
    pub async fn connect_over(
        config: ClientConfig,
        read: StreamReader,
        write: StreamWriter,
    ) -> Result<Client, ClientError> {
        let connect_timeout = config.connect_timeout;
        tokio::time::timeout(connect_timeout, Client::handshake(config, read, write))
            .await
            .unwrap_or(Err(ClientError::Timeout))
    }

    async fn handshake(
        config: ClientConfig,
        read: StreamReader,
        write: StreamWriter,
    ) -> Result<Client, ClientError> {
        let connection = Connection::start(read, write, config.max_frame_bytes);
        let mut client = Client { connection, config, token: None };
        if let Some(credentials) = &client.config.credentials {
            let request = match credentials {
                Credentials::Password { username, password } => Request::Auth(AuthRequest {
                    username: Some(text(username)),
                    password: Some(text(password)),
                }),
                Credentials::Certificate => Request::MtlsAuth(Empty),
                Credentials::Token(jwt) => {
                    Request::TokenAuth(TokenAuthRequest { jwt: Some(text(jwt)) })
                }
            };
            let timeout = client.config.connect_timeout;
            let answer = client.connection.call(request, timeout).await?;
            let (Response::Auth(TokenResponse { token })
            | Response::MtlsAuth(TokenResponse { token })
            | Response::TokenAuth(TokenResponse { token })) = answer
            else {
                return Err(unexpected(answer));
            };
            client.token = token.map(|token| String::from_utf8_lossy(&token).into_owned());
        }
        Ok(client)
    }

    /// The session token the server answered the login with.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Whether the connection has ended; every call then fails with the cause.
    pub fn is_closed(&self) -> bool {
        self.connection.is_closed()
    }

    /// Any request, answered within the configured request timeout. The typed methods below
    /// are built on it; it is public for keys they do not cover.
    pub async fn request(&self, request: Request) -> Result<Response, ClientError> {
        self.request_within(request, self.config.request_timeout).await
    }

    pub async fn request_within(
        &self,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        self.connection.call(request, timeout).await
    }

    /// Key 1: a topic with one range.
    pub async fn create_topic(&self, topic: &str) -> Result<(), ClientError> {
        let request = CreateTopicRequest {
            topic: Some(text(topic)),
            keyspace_bits: CREATE_TOPIC_KEYSPACE_BITS,
        };
        call!(self, CreateTopic(request));
        Ok(())
    }

    /// Key 69: a topic with `initial_ranges` ranges (a power of two).
    pub async fn create_topic_with_ranges(
        &self,
        topic: &str,
        initial_ranges: u32,
    ) -> Result<(), ClientError> {
        let request = CreateTopicRangesRequest { topic: Some(text(topic)), initial_ranges };
        call!(self, CreateTopicRanges(request));
        Ok(())
    }

    /// Key 2: appends `records` (durably, once it answers) and returns how many were appended.
    pub async fn produce(&self, topic: &str, records: Vec<Record>) -> Result<u32, ClientError> {
        let request = ProduceRequest { topic: Some(text(topic)), records };
        Ok(call!(self, Produce(request)).count)
    }

    /// Key 3: one page of records and the cursor to continue from. The timeout is the request
    /// timeout plus `wait_ms`.
    pub async fn fetch(
        &self,
        topic: &str,
        options: &FetchOptions,
    ) -> Result<(Vec<Record>, Bytes), ClientError> {
        let request = FetchRequest {
            topic: Some(text(topic)),
            cursor: options.cursor.clone(),
            group: options.group.as_deref().map(text),
            member: options.member.as_deref().map(text),
            max_records: options.max,
            wait_ms: options.wait_ms,
        };
        let timeout = self.config.request_timeout + Duration::from_millis(options.wait_ms.into());
        match self.request_within(Request::Fetch(request), timeout).await? {
            Response::Fetch(page) => Ok((page.records, page.next_cursor)),
            other => Err(unexpected(other)),
        }
    }

    /// Key 4: stores `cursor` as the group's position.
    pub async fn commit(
        &self,
        topic: &str,
        group: &str,
        cursor: &Bytes,
    ) -> Result<(), ClientError> {
        let request = CommitRequest {
            topic: Some(text(topic)),
            group: Some(text(group)),
            cursor: Some(cursor.clone()),
        };
        call!(self, Commit(request));
        Ok(())
    }

    /// Key 5. The connection enters SUBSCRIBED mode, where it serves nothing but the
    /// subscription, so the subscription takes the client. The server answers a successful
    /// subscribe with nothing: a refusal arrives as the first item of
    /// [`Subscription::next`].
    pub async fn subscribe(
        self,
        topic: &str,
        options: &SubscribeOptions,
    ) -> Result<Subscription, ClientError> {
        let topic = text(topic);
        let group = options.group.as_deref().map(text);
        let member = options.member.as_deref().map(text);
        let request = SubscribeRequest {
            topic: Some(topic.clone()),
            group: group.clone(),
            member: member.clone(),
            window_records: options.window,
            max_records: options.max,
        };
        let pushes = self.connection.open_pushes(Request::Subscribe(request)).await?;
        Ok(Subscription::new(self.connection, pushes, topic, group, member))
    }

    /// Key 7: removes `member` from `group` at once (instead of after its session times out).
    pub async fn leave_group(
        &self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<(), ClientError> {
        let request = LeaveGroupRequest {
            topic: Some(text(topic)),
            group: Some(text(group)),
            member: Some(text(member)),
        };
        call!(self, LeaveGroup(request));
        Ok(())
    }

    /// Key 31: one page of one range of `topic` from `start`, each record with its position
    /// (what a group member commits with [`Client::commit_offsets`]). Waits up to `wait_ms`
    /// for records when there are none; the timeout is the request timeout plus `wait_ms`.
    pub async fn fetch_range(
        &self,
        topic: &str,
        range: u32,
        start: Start,
        max: u32,
        wait_ms: u32,
    ) -> Result<(Page, Vec<PositionedEntry>), ClientError> {
        let request = FetchRangeRequest {
            topic: Some(text(topic)),
            range,
            routes_version: 0,
            start,
            max_records: max,
            max_bytes: 0,
            wait_ms,
            accept: Accept(1),
        };
        let timeout = self.config.request_timeout + Duration::from_millis(wait_ms.into());
        let page = match self.request_within(Request::FetchRange(request), timeout).await? {
            Response::FetchRange(page) => page,
            other => return Err(unexpected(other)),
        };
        let limits = BatchLimits { inflated_bytes_max: INFLATED_BATCH_BYTES_MAX_DEFAULT };
        let entries =
            page.entries(limits).map_err(|error| ClientError::Protocol(error.to_string()))?;
        Ok((page, entries))
    }

    /// Key 32: joins `member` to `group` in the topic's replicated membership; the answer is
    /// the generation and the ranges this member reads. Heartbeat within `session_ms`.
    pub async fn join_group(
        &self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<Assignment, ClientError> {
        let request = JoinGroupRequest {
            topic: Some(text(topic)),
            group: Some(text(group)),
            member: Some(text(member)),
        };
        Ok(call!(self, JoinGroup(request)))
    }

    /// Key 33: keeps `member` alive. `generation` is the last assignment the member applied
    /// (it reads only those ranges now): ranges it gave up can then move to other members.
    pub async fn group_heartbeat(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        generation: u64,
    ) -> Result<Assignment, ClientError> {
        let request = GroupHeartbeatRequest {
            topic: Some(text(topic)),
            group: Some(text(group)),
            member: Some(text(member)),
            generation,
        };
        Ok(call!(self, GroupHeartbeat(request)))
    }

    /// Key 34: commits `member`'s positions at `generation`; refused with
    /// `generation_mismatch` after a rebalance and `not_owner` for a range it does not hold.
    pub async fn commit_offsets(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        generation: u64,
        offsets: Vec<RangePosition>,
    ) -> Result<(), ClientError> {
        let request = CommitOffsetsRequest {
            topic: Some(text(topic)),
            group: Some(text(group)),
            member: Some(text(member)),
            generation,
            offsets,
        };
        call!(self, CommitOffsets(request));
        Ok(())
    }

    /// Key 8. `permissions` among `admin`, `produce`, `consume`.
    pub async fn create_user(
        &self,
        username: &str,
        password: &str,
        permissions: &[&str],
    ) -> Result<(), ClientError> {
        let request = CreateUserRequest {
            username: Some(text(username)),
            password: Some(text(password)),
            permissions: permissions.iter().map(|permission| Some(text(permission))).collect(),
        };
        call!(self, CreateUser(request));
        Ok(())
    }

    /// Key 9; also revokes the user's sessions and ACL grants.
    pub async fn delete_user(&self, username: &str) -> Result<(), ClientError> {
        call!(self, DeleteUser(DeleteUserRequest { username: Some(text(username)) }));
        Ok(())
    }

    /// Key 10.
    pub async fn change_password(
        &self,
        username: &str,
        new_password: &str,
    ) -> Result<(), ClientError> {
        let request = ChangePasswordRequest {
            username: Some(text(username)),
            new_password: Some(text(new_password)),
        };
        call!(self, ChangePassword(request));
        Ok(())
    }

    /// Key 11, sorted by username.
    pub async fn list_users(&self) -> Result<Vec<User>, ClientError> {
        let answer = call!(self, ListUsers(IgnoredPayload));
        let mut users: Vec<User> = answer
            .users
            .into_iter()
            .map(|user| User {
                username: lossy(user.username),
                permissions: user.permissions.into_iter().map(lossy).collect(),
            })
            .collect();
        users.sort_by(|first, second| first.username.cmp(&second.username));
        Ok(users)
    }

    /// Key 14. `operation` is `produce` or `consume`; `pattern` a topic or a prefix ending `*`.
    pub async fn grant_acl(
        &self,
        username: &str,
        operation: &str,
        pattern: &str,
    ) -> Result<(), ClientError> {
        call!(self, GrantAcl(acl_request(username, operation, pattern)));
        Ok(())
    }

    /// Key 15 (idempotent).
    pub async fn revoke_acl(
        &self,
        username: &str,
        operation: &str,
        pattern: &str,
    ) -> Result<(), ClientError> {
        call!(self, RevokeAcl(acl_request(username, operation, pattern)));
        Ok(())
    }

    /// Key 16, sorted by operation then resource.
    pub async fn list_acls(&self, username: &str) -> Result<Vec<Acl>, ClientError> {
        let answer = call!(self, ListAcls(ListAclsRequest { username: Some(text(username)) }));
        let mut acls: Vec<Acl> = answer
            .acls
            .into_iter()
            .map(|acl| Acl { operation: lossy(acl.operation), resource: lossy(acl.resource) })
            .collect();
        acls.sort_by(|first, second| {
            (&first.operation, &first.resource).cmp(&(&second.operation, &second.resource))
        });
        Ok(acls)
    }

    /// Key 17: defines or replaces a policy.
    pub async fn define_policy(
        &self,
        name: &str,
        fields: Vec<PolicyField>,
    ) -> Result<(), ClientError> {
        call!(self, DefinePolicy(DefinePolicyRequest { name: Some(text(name)), fields }));
        Ok(())
    }

    /// Key 18. Without `force`, a policy still bound to topics is refused (`policy_in_use`).
    pub async fn delete_policy(&self, name: &str, force: bool) -> Result<(), ClientError> {
        call!(self, DeletePolicy(DeletePolicyRequest { name: Some(text(name)), force }));
        Ok(())
    }

    /// Key 19, sorted by name.
    pub async fn list_policies(&self) -> Result<Vec<NamedPolicy>, ClientError> {
        Ok(call!(self, ListPolicies(Empty)).policies)
    }

    /// Key 20. `None` unbinds the topic.
    pub async fn bind_topic_policy(
        &self,
        topic: &str,
        name: Option<&str>,
    ) -> Result<(), ClientError> {
        let request = BindTopicPolicyRequest { topic: Some(text(topic)), name: name.map(text) };
        call!(self, BindTopicPolicy(request));
        Ok(())
    }

    /// Key 21.
    pub async fn get_topic_policy(&self, topic: &str) -> Result<TopicPolicyResponse, ClientError> {
        Ok(call!(self, GetTopicPolicy(GetTopicPolicyRequest { topic: Some(text(topic)) })))
    }

    /// Key 64, sorted.
    pub async fn list_topics(&self) -> Result<Vec<String>, ClientError> {
        let answer = call!(self, ListTopics(Empty));
        Ok(answer.topics.into_iter().map(lossy).collect())
    }

    /// Key 65.
    pub async fn describe_topic(&self, topic: &str) -> Result<DescribeTopicResponse, ClientError> {
        Ok(call!(self, DescribeTopic(DescribeTopicRequest { topic: Some(text(topic)) })))
    }

    /// Key 72: each segment with its replica set, and what each copy's broker reports of it.
    /// Key 73: the lag of `group` on `topic`, or (`None`) of every group that committed there.
    pub async fn group_lag(
        &self,
        topic: &str,
        group: Option<&str>,
    ) -> Result<GroupLagResponse, ClientError> {
        let request = GroupLagRequest { topic: Some(text(topic)), group: group.map(text) };
        Ok(call!(self, GroupLag(request)))
    }

    pub async fn describe_segments(
        &self,
        topic: &str,
    ) -> Result<DescribeSegmentsResponse, ClientError> {
        let request = DescribeSegmentsRequest { topic: Some(text(topic)) };
        Ok(call!(self, DescribeSegments(request)))
    }

    /// Key 66 (admin).
    pub async fn delete_topic(&self, topic: &str) -> Result<(), ClientError> {
        call!(self, DeleteTopic(DeleteTopicRequest { topic: Some(text(topic)) }));
        Ok(())
    }

    /// Key 67 (admin): returns the two halves `(low, high)`.
    pub async fn split_range(&self, topic: &str, range_id: u32) -> Result<(u32, u32), ClientError> {
        let request = SplitRangeRequest { topic: Some(text(topic)), range_id };
        let answer = call!(self, SplitRange(request));
        Ok((answer.low, answer.high))
    }

    /// Key 68 (admin): returns the merged range.
    pub async fn merge_ranges(
        &self,
        topic: &str,
        left: u32,
        right: u32,
    ) -> Result<u32, ClientError> {
        let request = MergeRangesRequest { topic: Some(text(topic)), left, right };
        Ok(call!(self, MergeRanges(request)).range_id)
    }

    /// Key 24: the brokers with their status, as the original's clients read them.
    pub async fn cluster_state(&self) -> Result<ClusterStateResponse, ClientError> {
        Ok(call!(self, ClusterState(Empty)))
    }

    /// Key 70 (admin): the cluster as the broker answering sees it.
    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse, ClientError> {
        Ok(call!(self, ClusterStatus(Empty)))
    }

    /// Key 71 (admin): decommissions broker `node_id`; `force` even while it holds sealed
    /// segments. Send it through another broker than the one removed.
    pub async fn remove_broker(&self, node_id: u64, force: bool) -> Result<(), ClientError> {
        call!(self, RemoveBroker(RemoveBrokerRequest { node_id, force }));
        Ok(())
    }

    /// Key 74 (admin): broker `node_id` hands its work over and keeps serving (`draining`), or
    /// takes work again; what it moved. Any broker answers. A hand-over takes seconds (each
    /// Raft leadership and write head moved in turn), so this waits up to two minutes.
    pub async fn drain_broker(
        &self,
        node_id: u64,
        draining: bool,
    ) -> Result<DrainBrokerResponse, ClientError> {
        let request = Request::DrainBroker(DrainBrokerRequest { node_id, draining });
        match self.request_within(request, DRAIN_TIMEOUT).await? {
            Response::DrainBroker(report) => Ok(report),
            other => Err(unexpected(other)),
        }
    }

    #[cfg(test)]
    pub(crate) fn set_next_corr(&self, corr: u32) {
        self.connection.set_next_corr(corr);
    }
}

fn acl_request(username: &str, operation: &str, pattern: &str) -> AclRequest {
    AclRequest {
        username: Some(text(username)),
        operation: Some(text(operation)),
        pattern: Some(text(pattern)),
    }
}

pub(crate) fn text(value: &str) -> Bytes {
    Bytes::copy_from_slice(value.as_bytes())
}

fn lossy(value: Option<Bytes>) -> String {
    value.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
}

fn unexpected(response: Response) -> ClientError {
    ClientError::Protocol(format!("unexpected answer: {}", response.api_key()))
}
