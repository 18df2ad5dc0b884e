//! Request handlers: one arm per api key, each checking its permission and calling the log API
//! or the administrative machine. Every refusal is a wire reason.

use bytes::Bytes;
use malachi_broker::error::LogError;
use malachi_broker::fetch::FetchArgs;
use malachi_broker::gossip::PeerStatus;
use malachi_meta::{AdminCommand, AdminError, Operation};
use malachi_wire::messages::{
    AclEntry, AclRequest, Broker as WireBroker, BrokerStatus, ClusterStateResponse,
    CreateUserRequest, Empty, FetchRequest, FetchResponse, ListAclsResponse, ListUsersResponse,
    ListUsersWithRolesResponse, ProduceRequest, ProduceResponse, UserPermissions, UserWithRole,
};
use malachi_wire::{ApiKey, Reason, Request, Response};

use crate::connection::{Connection, Outcome};
use crate::convert::{self, text, text_bytes};

/// Keys 25-30 (routes, producer and consumer streams) are behind the original's
/// `producer_streams` flag, which is off: they answer `unsupported`. The members' keys 31-34
/// are served ([`crate::members`]).
pub fn is_stream_key(key: ApiKey) -> bool {
    (25..=34).contains(&key.as_u16()) && !crate::members::is_member_key(key)
}

pub(crate) async fn dispatch(connection: &mut Connection, corr: u32, request: Request) -> Outcome {
    match request {
        Request::CreateTopic(request) => create_topic(connection, corr, request.topic).await,
        Request::Produce(request) => produce(connection, corr, request).await,
        Request::Fetch(request) => fetch(connection, corr, request).await,
        Request::Commit(request) => commit(connection, corr, request).await,
        Request::Subscribe(request) => crate::subscription::open(connection, corr, request),
        Request::LeaveGroup(request) => {
            let (topic, group, member) =
                (text(&request.topic), text(&request.group), text(&request.member));
            if let Some(topic) = &topic
                && !connection.permitted(Operation::Consume, topic)
            {
                return Connection::refuse(corr, Reason::PermissionDenied.as_str());
            }
            if let (Some(topic), Some(group), Some(member)) = (topic, group, member) {
                let groups = connection.broker.groups();
                groups.leave_group(&topic, &group, &member);
                if groups.is_replicated_member(&topic, &group, &member) {
                    // Ok whatever happens (section 3.3); a member that did not leave times out.
                    let _ = groups.leave_member(&topic, &group, &member).await;
                }
            }
            Connection::reply(corr, Response::LeaveGroup(Empty))
        }
        Request::ClusterState(_) => cluster_state(connection, corr),
        Request::FetchRange(request) => {
            crate::members::fetch_range(connection, corr, request).await
        }
        Request::JoinGroup(request) => crate::members::join(connection, corr, request).await,
        Request::GroupHeartbeat(request) => {
            crate::members::heartbeat(connection, corr, request).await
        }
        Request::CommitOffsets(request) => crate::members::commit(connection, corr, request).await,
        request if request.api_key().as_u16() >= ApiKey::ListTopics.as_u16() => {
            crate::extensions::handle(connection, corr, request).await
        }
        other => admin(connection, corr, other).await,
    }
}

async fn create_topic(connection: &mut Connection, corr: u32, topic: Option<Bytes>) -> Outcome {
    let Some(topic) = text(&topic) else {
        return Connection::refuse(corr, Reason::InvalidTopicName.as_str());
    };
    if !connection.permitted(Operation::Produce, &topic) {
        return Connection::refuse(corr, Reason::PermissionDenied.as_str());
    }
    // The original ignores keyspace_bits and creates one range (wire-protocol.md section 7.1).
    let creator = connection.topic_creator();
    match connection.broker.create_topic(&topic, None, creator.as_deref()).await {
        Ok(_) => Connection::reply(corr, Response::CreateTopic(Empty)),
        Err(error) => Connection::refuse(corr, error.reason()),
    }
}

async fn produce(connection: &mut Connection, corr: u32, request: ProduceRequest) -> Outcome {
    let Some(topic) = text(&request.topic) else {
        return Connection::refuse(corr, Reason::NoSuchTopic.as_str());
    };
    if !connection.permitted(Operation::Produce, &topic) {
        return Connection::refuse(corr, Reason::PermissionDenied.as_str());
    }
    let records: Vec<_> = request.records.into_iter().map(convert::record_from_wire).collect();
    let bytes = records.iter().map(|record| record.user_bytes()).sum();
    let now_ms = connection.broker.clock().now_ms();
    let user = &connection.session.username;
    let charged =
        connection.shared.quotas.charge_publish(user, records.len() as u64, bytes, now_ms);
    if let Err(reason) = charged {
        connection.broker.metrics().refused_for_rate("publish");
        return Connection::refuse(corr, reason.as_str());
    }
    let timer = malachi_broker::metrics::Timer::start();
    match connection.broker.produce(&topic, records, &mut connection.spread).await {
        Ok(count) => {
            timer.observe(&connection.broker.metrics().produce_ack_seconds);
            Connection::reply(corr, Response::Produce(ProduceResponse { count }))
        }
        Err(error) => Connection::refuse(corr, error.reason()),
    }
}

async fn fetch(connection: &mut Connection, corr: u32, request: FetchRequest) -> Outcome {
    let Some(topic) = text(&request.topic) else {
        return Connection::reply(corr, Response::Fetch(FetchResponse::default()));
    };
    if !connection.permitted(Operation::Consume, &topic) {
        return Connection::refuse(corr, Reason::PermissionDenied.as_str());
    }
    let (group, member) = (text(&request.group), text(&request.member));
    let args = FetchArgs {
        topic: &topic,
        cursor: request.cursor.as_deref(),
        group: group.as_deref(),
        member: member.as_deref(),
        max: request.max_records,
        wait_ms: request.wait_ms,
        total_max: None,
    };
    match connection.broker.fetch(&args).await {
        Ok(page) => Connection::reply(corr, Response::Fetch(page_to_wire(page))),
        Err(error) => Connection::refuse(corr, error.reason()),
    }
}

pub(crate) fn page_to_wire(page: malachi_broker::fetch::FetchPage) -> FetchResponse {
    FetchResponse {
        records: page.records.into_iter().map(convert::record_to_wire).collect(),
        next_cursor: Bytes::from(page.next_cursor),
    }
}

async fn commit(
    connection: &mut Connection,
    corr: u32,
    request: malachi_wire::messages::CommitRequest,
) -> Outcome {
    let (Some(topic), Some(group)) = (text(&request.topic), text(&request.group)) else {
        return Connection::refuse(corr, Reason::MalformedRequest.as_str());
    };
    if !connection.permitted(Operation::Consume, &topic) {
        return Connection::refuse(corr, Reason::PermissionDenied.as_str());
    }
    match connection.broker.groups().commit(&topic, &group, request.cursor.as_deref()).await {
        Ok(()) => Connection::reply(corr, Response::Commit(Empty)),
        Err(error) => Connection::refuse(corr, error.reason()),
    }
}

fn cluster_state(connection: &Connection, corr: u32) -> Outcome {
    let broker = &connection.broker;
    let version = broker.metadata_version();
    let brokers = broker
        .cluster_view()
        .brokers
        .iter()
        .map(|view| {
            let (host, port) = split_host_port(&view.record.client_address);
            WireBroker {
                id: text_bytes(&view.record.node_id.to_string()),
                host: text_bytes(host),
                port,
                status: match view.status {
                    PeerStatus::Alive => BrokerStatus::Alive,
                    PeerStatus::Suspect => BrokerStatus::Suspect,
                    PeerStatus::Dead => BrokerStatus::Dead,
                },
            }
        })
        .collect();
    let vnodes = broker.ring().iter().map(|vnode| vnode.vnode_id()).collect();
    let response = ClusterStateResponse { version, streams_enabled: false, brokers, vnodes };
    Connection::reply(corr, Response::ClusterState(response))
}

/// `host:port` (IPv6 hosts in brackets) as host and port; port 0 when there is none.
fn split_host_port(address: &str) -> (&str, u16) {
    match address.rsplit_once(':') {
        Some((host, port)) => {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            (host, port.parse().unwrap_or(0))
        }
        None => (address, 0),
    }
}

/// Keys 8-11 and 14-23; the caller already checked `admin`.
async fn admin(connection: &mut Connection, corr: u32, request: Request) -> Outcome {
    let outcome = match request {
        Request::CreateUser(request) => create_user(connection, request).await,
        Request::DeleteUser(request) => {
            let username = text(&request.username).unwrap_or_default();
            admin_command(connection, AdminCommand::DeleteUser { username })
                .await
                .map(|()| Response::DeleteUser(Empty))
        }
        Request::ChangePassword(request) => change_password(connection, request).await,
        Request::ListUsers(_) => Ok(list_users(connection)),
        Request::GrantAcl(request) => {
            let command = acl_command(&request, true);
            admin_command(connection, command).await.map(|()| Response::GrantAcl(Empty))
        }
        Request::RevokeAcl(request) => {
            let command = acl_command(&request, false);
            admin_command(connection, command).await.map(|()| Response::RevokeAcl(Empty))
        }
        Request::ListAcls(request) => {
            Ok(list_acls(connection, &text(&request.username).unwrap_or_default()))
        }
        Request::SetRole(request) => {
            let command = AdminCommand::SetRole {
                username: text(&request.username).unwrap_or_default(),
                role: text(&request.role),
            };
            admin_command(connection, command).await.map(|()| Response::SetRole(Empty))
        }
        Request::ListUsersWithRoles(_) => Ok(list_users_with_roles(connection)),
        other => crate::policies::handle(connection, other).await,
    };
    match outcome {
        Ok(response) => Connection::reply(corr, response),
        Err(reason) => Connection::refuse(corr, reason),
    }
}

async fn admin_command(connection: &Connection, command: AdminCommand) -> Result<(), String> {
    match connection.broker.admin_command(command).await {
        Ok(_) => Ok(()),
        // The original answers an administrative write it could not commit so.
        Err(LogError::Unavailable(_)) => Err(Reason::PersistFailed.as_str().to_string()),
        Err(error) => Err(error.reason()),
    }
}

async fn create_user(
    connection: &Connection,
    request: CreateUserRequest,
) -> Result<Response, String> {
    let (Some(username), Some(password)) = (text(&request.username), text(&request.password))
    else {
        return Err(Reason::MalformedRequest.as_str().into());
    };
    let Some(permissions) = request.permissions.iter().map(text).collect::<Option<Vec<String>>>()
    else {
        return Err(AdminError::InvalidPermissions.reason_text());
    };
    let password_hash = new_password_hash(connection, password).await?;
    let command = AdminCommand::CreateUser { username, password_hash, permissions, role: None };
    admin_command(connection, command).await.map(|()| Response::CreateUser(Empty))
}

/// Changes a password. Every session of the user then ends at its next request (see
/// `Connection::session_alive`), except this one when it changed its own password: it proved
/// it holds the account, and the client need not log in again.
async fn change_password(
    connection: &mut Connection,
    request: malachi_wire::messages::ChangePasswordRequest,
) -> Result<Response, String> {
    let (Some(username), Some(password)) = (text(&request.username), text(&request.new_password))
    else {
        return Err(Reason::MalformedRequest.as_str().into());
    };
    let password_hash = new_password_hash(connection, password).await?;
    let own = username == connection.session.username;
    let command = AdminCommand::ChangePassword { username, password_hash: password_hash.clone() };
    admin_command(connection, command).await?;
    if own {
        connection.session.password_hash = password_hash;
    }
    Ok(Response::ChangePassword(Empty))
}

/// The hash of a new password, or `invalid_password` if it is shorter than
/// `MALACHI_MIN_PASSWORD_LEN` (checked before any Argon2 work).
async fn new_password_hash(connection: &Connection, password: String) -> Result<String, String> {
    connection
        .broker
        .admin()
        .hash_new_password(password)
        .await
        .map_err(|error| error.reason().as_str().to_owned())
}

fn acl_command(request: &AclRequest, grant: bool) -> AdminCommand {
    let username = text(&request.username).unwrap_or_default();
    let operation = text(&request.operation).unwrap_or_default();
    let pattern = text(&request.pattern).unwrap_or_default();
    if grant {
        AdminCommand::GrantAcl { username, operation, pattern }
    } else {
        AdminCommand::RevokeAcl { username, operation, pattern }
    }
}

fn permission_names(permissions: &[malachi_meta::Permission]) -> Vec<Option<Bytes>> {
    permissions.iter().map(|permission| text_bytes(permission_name(*permission))).collect()
}

fn permission_name(permission: malachi_meta::Permission) -> &'static str {
    match permission {
        malachi_meta::Permission::Admin => "admin",
        malachi_meta::Permission::Produce => "produce",
        malachi_meta::Permission::Consume => "consume",
    }
}

fn list_users(connection: &Connection) -> Response {
    let users = connection.broker.read_admin(|admin| {
        admin
            .list_users()
            .into_iter()
            .map(|(name, permissions)| UserPermissions {
                username: text_bytes(name),
                permissions: permission_names(&permissions),
            })
            .collect()
    });
    Response::ListUsers(ListUsersResponse { users })
}

fn list_users_with_roles(connection: &Connection) -> Response {
    let users = connection.broker.read_admin(|admin| {
        admin
            .list_users_with_roles()
            .into_iter()
            .map(|(name, permissions, role)| UserWithRole {
                username: text_bytes(name),
                permissions: permission_names(&permissions),
                role: text_bytes(match role {
                    Some(malachi_meta::Role::Viewer) => "viewer",
                    Some(malachi_meta::Role::Editor) => "editor",
                    Some(malachi_meta::Role::Admin) => "admin",
                    None => "none",
                }),
            })
            .collect()
    });
    Response::ListUsersWithRoles(ListUsersWithRolesResponse { users })
}

fn list_acls(connection: &Connection, username: &str) -> Response {
    let acls = connection.broker.read_admin(|admin| {
        admin
            .list_acls(username)
            .into_iter()
            .map(|(operation, pattern)| AclEntry {
                operation: text_bytes(match operation {
                    Operation::Produce => "produce",
                    Operation::Consume => "consume",
                }),
                resource: text_bytes(pattern),
            })
            .collect()
    });
    Response::ListAcls(ListAclsResponse { acls })
}
