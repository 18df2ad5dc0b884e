//! Keys 31-34: consumer group members join, heartbeat and commit with generation fencing,
//! through the vnode's replicated membership (`malachi_broker::members`), and read their ranges
//! one at a time with each record's position (`fetch_range`). The original leaves keys 32-34
//! without a server; Malachi serves 31-34 whatever the streams flag says.

use malachi_broker::error::LogError;
use malachi_broker::members::{MemberAssignment, MemberPosition};
use malachi_broker::range_fetch::{RangePage, RangeStart};
use malachi_meta::Operation;
use malachi_wire::limits::INFLATED_BATCH_BYTES_MAX_DEFAULT;
use malachi_wire::messages::{
    Assignment, CommitOffsetsRequest, Empty, FetchRangeRequest, GroupHeartbeatRequest,
    JoinGroupRequest, Page,
};
use malachi_wire::shapes::{Position, Start};
use malachi_wire::{Codec, PositionedEntry, Reason, Response, encode_batch};

use crate::connection::{Connection, Outcome};
use crate::convert::text;

/// Whether `key` is one of the members' keys, served whatever the streams flag says.
pub fn is_member_key(key: malachi_wire::ApiKey) -> bool {
    (31..=34).contains(&key.as_u16())
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

/// Key 31: one page of one range, each record with its position. `routes_version` is not
/// checked: key 25, which hands versions out, is not served yet.
pub(crate) async fn fetch_range(
    connection: &Connection,
    corr: u32,
    request: FetchRangeRequest,
) -> Outcome {
    let Some(topic) = text(&request.topic) else {
        return Connection::refuse(corr, Reason::MalformedRequest.as_str());
    };
    if !connection.permitted(Operation::Consume, &topic) {
        return Connection::refuse(corr, Reason::PermissionDenied.as_str());
    }
    if request.accept.0 & 1 == 0 {
        return Connection::refuse(corr, Reason::UnsupportedCodec.as_str());
    }
    let now_ms = connection.broker.clock().now_ms();
    let user = &connection.session.username;
    if let Err(reason) = connection.shared.quotas.charge_subscribe(user, now_ms) {
        return Connection::refuse(corr, reason.as_str());
    }
    let start = match request.start {
        Start::Earliest => RangeStart::Earliest,
        Start::Latest => RangeStart::Latest,
        Start::Position(position) => {
            RangeStart::At { source_index: position.source_index, offset: position.offset }
        }
        Start::Group(group) => match text(&group) {
            Some(group) => RangeStart::Group(group),
            None => return Connection::refuse(corr, Reason::MalformedRequest.as_str()),
        },
    };
    let bytes_max = match request.max_bytes {
        0 => INFLATED_BATCH_BYTES_MAX_DEFAULT,
        bytes => bytes.min(INFLATED_BATCH_BYTES_MAX_DEFAULT),
    };
    let limits = (request.max_records, u64::from(bytes_max), request.wait_ms);
    match connection.broker.fetch_range(&topic, request.range, start, limits).await {
        Ok(page) => Connection::reply(corr, Response::FetchRange(to_wire(page))),
        Err(error) => Connection::refuse(corr, error.reason()),
    }
}

fn to_wire(page: RangePage) -> Page {
    let source_index = page.history_index;
    let entries: Vec<PositionedEntry> = page
        .records
        .into_iter()
        .map(|(offset, record)| PositionedEntry {
            position: Position { source_index, offset },
            tombstone: false,
            record: crate::convert::record_to_wire(record),
        })
        .collect();
    let mut batch = bytes::BytesMut::new();
    encode_batch(&entries, Codec::None, &mut batch).expect("an uncompressed batch always encodes");
    Page {
        next: Position { source_index, offset: page.next },
        skip: 0,
        backlog: page.backlog,
        expired: page.expired,
        expired_exact: true,
        batch: batch.freeze(),
    }
}
