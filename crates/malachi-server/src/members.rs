//! Keys 32-34: consumer group members join, heartbeat and commit with generation fencing,
//! through the vnode's replicated membership (`malachi_broker::members`). The original leaves
//! these keys without a server; Malachi serves them whatever the streams flag says.

use malachi_broker::error::LogError;
use malachi_broker::members::{MemberAssignment, MemberPosition};
use malachi_meta::Operation;
use malachi_wire::messages::{
    Assignment, CommitOffsetsRequest, Empty, GroupHeartbeatRequest, JoinGroupRequest,
};
use malachi_wire::{Reason, Response};

use crate::connection::{Connection, Outcome};
use crate::convert::text;

/// Whether the server answers `key` itself (the group keys do not wait for the streams flag).
pub fn is_group_key(key: malachi_wire::ApiKey) -> bool {
    (32..=34).contains(&key.as_u16())
}

/// The topic, group and member a request names, once the member may consume the topic.
fn names(
    connection: &Connection,
    topic: &Option<bytes::Bytes>,
    group: &Option<bytes::Bytes>,
    member: &Option<bytes::Bytes>,
) -> Result<(String, String, String), Reason> {
    let (Some(topic), Some(group), Some(member)) = (text(topic), text(group), text(member)) else {
        return Err(Reason::MalformedRequest);
    };
    if !connection.permitted(Operation::Consume, &topic) {
        return Err(Reason::PermissionDenied);
    }
    Ok((topic, group, member))
}

pub(crate) async fn join(connection: &Connection, corr: u32, request: JoinGroupRequest) -> Outcome {
    let (topic, group, member) =
        match names(connection, &request.topic, &request.group, &request.member) {
            Ok(names) => names,
            Err(reason) => return Connection::refuse(corr, reason.as_str()),
        };
    let told = connection.broker.groups().join_member(&topic, &group, &member).await;
    answer(corr, told, Response::JoinGroup)
}

pub(crate) async fn heartbeat(
    connection: &Connection,
    corr: u32,
    request: GroupHeartbeatRequest,
) -> Outcome {
    let (topic, group, member) =
        match names(connection, &request.topic, &request.group, &request.member) {
            Ok(names) => names,
            Err(reason) => return Connection::refuse(corr, reason.as_str()),
        };
    let groups = connection.broker.groups();
    let told = groups.heartbeat_member_at(&topic, &group, &member, request.generation).await;
    answer(corr, told, Response::GroupHeartbeat)
}

pub(crate) async fn commit(
    connection: &Connection,
    corr: u32,
    request: CommitOffsetsRequest,
) -> Outcome {
    let (topic, group, member) =
        match names(connection, &request.topic, &request.group, &request.member) {
            Ok(names) => names,
            Err(reason) => return Connection::refuse(corr, reason.as_str()),
        };
    let positions: Vec<MemberPosition> = request
        .offsets
        .iter()
        .map(|entry| MemberPosition {
            range_id: entry.range,
            source_index: entry.position.source_index,
            offset: entry.position.offset,
        })
        .collect();
    let groups = connection.broker.groups();
    match groups.commit_member(&topic, &group, &member, request.generation, &positions).await {
        Ok(()) => Connection::reply(corr, Response::CommitOffsets(Empty)),
        Err(error) => Connection::refuse(corr, error.reason()),
    }
}

fn answer(
    corr: u32,
    told: Result<MemberAssignment, LogError>,
    respond: fn(Assignment) -> Response,
) -> Outcome {
    match told {
        Ok(told) => Connection::reply(
            corr,
            respond(Assignment {
                generation: told.generation,
                session_ms: u32::try_from(told.session_ms).unwrap_or(u32::MAX),
                ranges: told.ranges,
            }),
        ),
        Err(error) => Connection::refuse(corr, error.reason()),
    }
}
