//! Malachi's own keys 64-73 (`docs/protocol.md`): topic listing, describe, delete, split, merge,
//! create with an initial range count, the cluster's status, removing a broker, each segment's
//! copies, and consumer lag. The original protocol has no keys for these.

use malachi_broker::describe;
use malachi_meta::Operation;
use malachi_wire::limits::ENVELOPE_BYTES;
use malachi_wire::messages::{
    ClusterBroker, ClusterGroup, ClusterStatusResponse, CopyDescription, DescribeSegmentsResponse,
    DescribeTopicResponse, DrainBrokerResponse, Empty, GroupLagDescription, GroupLagResponse,
    LagStanding, ListTopicsResponse, MergeRangesResponse, RangeDescription, RangeLagDescription,
    RangeState, SegmentDescription, SegmentState, SplitRangeResponse,
};
use malachi_wire::{Reason, Request, Response, Wire};

use crate::connection::{Connection, Outcome};
use crate::convert::{text, text_bytes};

pub(crate) async fn handle(connection: &mut Connection, corr: u32, request: Request) -> Outcome {
    let outcome = match request {
        Request::ListTopics(_) => Ok(list_topics(connection)),
        Request::DescribeTopic(request) => describe(connection, text(&request.topic)).await,
        Request::DescribeSegments(request) => {
            describe_segments(connection, text(&request.topic)).await
        }
        Request::GroupLag(request) => {
            group_lag(connection, text(&request.topic), text(&request.group)).await
        }
        Request::DeleteTopic(request) => {
            let topic = text(&request.topic).unwrap_or_default();
            connection
                .broker
                .delete_topic(&topic)
                .await
                .map(|()| Response::DeleteTopic(Empty))
                .map_err(|e| e.reason())
        }
        Request::SplitRange(request) => {
            let topic = text(&request.topic).unwrap_or_default();
            match connection.broker.split(&topic, request.range_id).await {
                Ok([low, high]) => Ok(Response::SplitRange(SplitRangeResponse { low, high })),
                Err(error) => Err(error.reason()),
            }
        }
        Request::MergeRanges(request) => {
            let topic = text(&request.topic).unwrap_or_default();
            match connection.broker.merge(&topic, request.left, request.right).await {
                Ok(range_id) => Ok(Response::MergeRanges(MergeRangesResponse { range_id })),
                Err(error) => Err(error.reason()),
            }
        }
        Request::CreateTopicRanges(request) => {
            create(connection, text(&request.topic), request.initial_ranges).await
        }
        Request::ClusterStatus(_) => Ok(cluster_status(connection)),
        Request::RemoveBroker(request) => {
            match connection.broker.seats().decommission(request.node_id, request.force).await {
                Ok(()) => Ok(Response::RemoveBroker(Empty)),
                Err(error) => {
                    tracing::info!(node_id = request.node_id, %error, "remove_broker refused");
                    Err(error.reason().to_string())
                }
            }
        }
        Request::DrainBroker(request) => {
            let handover = connection.broker.handover();
            match handover.drain_broker(request.node_id, request.draining).await {
                Ok(report) => Ok(Response::DrainBroker(drained(report))),
                Err(error) => {
                    tracing::info!(node_id = request.node_id, %error, "drain_broker refused");
                    Err(error.reason().to_string())
                }
            }
        }
        _ => Err(Reason::UnknownApiKey.as_str().to_string()),
    };
    match outcome {
        Ok(response) => Connection::reply(corr, response),
        Err(reason) => Connection::refuse(corr, reason),
    }
}

/// A hand-over's counts as `drain_broker` answers them.
fn drained(report: malachi_broker::handover::HandoverReport) -> DrainBrokerResponse {
    let count = |count: usize| u32::try_from(count).unwrap_or(u32::MAX);
    DrainBrokerResponse {
        brokers_told: count(report.brokers_told),
        leaderships_moved: count(report.leaderships_moved),
        leaderships_kept: count(report.leaderships_kept),
        heads_rolled: count(report.heads_rolled),
        heads_left: count(report.heads_left),
    }
}

/// The cluster as this broker sees it (the caller already checked `admin`).
fn cluster_status(connection: &Connection) -> Response {
    let view = connection.broker.cluster_view();
    let clustered = view.cluster_id.is_some();
    let brokers = view
        .brokers
        .into_iter()
        .map(|broker| ClusterBroker {
            node_id: broker.record.node_id,
            cluster_address: clustered
                .then(|| text_bytes(&broker.record.cluster_address))
                .flatten(),
            client_address: text_bytes(&broker.record.client_address),
            status: broker.status as u8,
            attributes: broker
                .record
                .attributes
                .iter()
                .map(|(name, value)| text_bytes(&format!("{name}={value}")))
                .collect(),
        })
        .collect();
    let groups = view
        .groups
        .into_iter()
        .map(|group| ClusterGroup {
            group_id: group.group_id,
            leader: group.leader.unwrap_or(0),
            term: group.term,
            voters: group.voters.into_iter().collect(),
            learners: group.learners.into_iter().collect(),
        })
        .collect();
    Response::ClusterStatus(ClusterStatusResponse {
        node_id: view.node_id,
        cluster_id: view.cluster_id.as_deref().and_then(text_bytes),
        brokers,
        groups,
        replicas_wanted: u16::try_from(connection.broker.replicas_wanted()).unwrap_or(u16::MAX),
    })
}

/// Names of the topics this session may produce to or consume from.
fn list_topics(connection: &Connection) -> Response {
    let topics = connection
        .broker
        .list_topics()
        .into_iter()
        .filter(|topic| {
            connection.permitted(Operation::Consume, topic)
                || connection.permitted(Operation::Produce, topic)
        })
        .map(|topic| text_bytes(&topic))
        .collect();
    Response::ListTopics(ListTopicsResponse { topics })
}

/// The topic a describe names, if the session may produce to or consume from it.
fn describable(connection: &Connection, topic: Option<String>) -> Result<String, String> {
    let topic = topic.ok_or_else(|| Reason::NoSuchTopic.as_str().to_string())?;
    if !connection.permitted(Operation::Consume, &topic)
        && !connection.permitted(Operation::Produce, &topic)
    {
        return Err(Reason::PermissionDenied.as_str().to_string());
    }
    Ok(topic)
}

async fn describe(connection: &Connection, topic: Option<String>) -> Result<Response, String> {
    let topic = describable(connection, topic)?;
    let info = connection.broker.describe_topic(&topic).await.map_err(|error| error.reason())?;
    let ranges = info
        .ranges
        .iter()
        .map(|range| RangeDescription {
            range_id: range.range_id,
            start: range.start,
            end_inclusive: range.end_inclusive,
            state: if range.active { RangeState::Active } else { RangeState::Sealed },
            parents: range.parents.clone(),
            children: range.children.clone(),
            segments: range.segments,
            records: range.records,
            expired_records: range.expired_records,
        })
        .collect();
    Ok(Response::DescribeTopic(DescribeTopicResponse {
        topic: text_bytes(&info.name),
        topic_id: info.topic_id,
        created_ms: info.created_ms,
        policy: info.policy.as_deref().and_then(text_bytes),
        ranges,
    }))
}

/// Each segment of the topic with its copies, the first ones only if they would not all fit in
/// one frame.
async fn describe_segments(
    connection: &Connection,
    topic: Option<String>,
) -> Result<Response, String> {
    let topic = describable(connection, topic)?;
    let described = connection.broker.observer().describe_segments(&topic).await;
    let described = described.map_err(|error| error.reason())?;
    // The envelope, the topic and the list's count come before the segments.
    let mut answer = DescribeSegmentsResponse { topic: text_bytes(&topic), segments: Vec::new() };
    let empty_bytes = answer.encode_to_bytes().map_or(usize::MAX, |bytes| bytes.len());
    let frame_bytes_max = connection.broker.config().max_frame_bytes as usize;
    let room_bytes = frame_bytes_max.saturating_sub(ENVELOPE_BYTES).saturating_sub(empty_bytes);
    answer.segments = first_fitting(described.iter().map(segment_to_wire).collect(), room_bytes);
    Ok(Response::DescribeSegments(answer))
}

/// The lag of one group, or of every group that committed on the topic (as many as fit in one
/// frame, in group name order).
async fn group_lag(
    connection: &Connection,
    topic: Option<String>,
    group: Option<String>,
) -> Result<Response, String> {
    let topic = topic.ok_or_else(|| Reason::NoSuchTopic.as_str().to_string())?;
    if !connection.permitted(Operation::Consume, &topic) {
        return Err(Reason::PermissionDenied.as_str().to_string());
    }
    let broker = &connection.broker;
    let lags = match group {
        Some(group) => broker.observer().group_lag(&topic, &group).await.map(|lag| vec![lag]),
        None => broker.observer().topic_group_lags(&topic).await,
    };
    let lags = lags.map_err(|error| error.reason())?;
    let mut answer = GroupLagResponse { topic: text_bytes(&topic), groups: Vec::new() };
    let frame_bytes_max = broker.config().max_frame_bytes as usize;
    let room_bytes = frame_bytes_max.saturating_sub(ENVELOPE_BYTES);
    for lag in &lags {
        answer.groups.push(group_lag_to_wire(lag));
        let fits = answer.encode_to_bytes().is_ok_and(|bytes| bytes.len() <= room_bytes);
        if !fits {
            answer.groups.pop();
            break;
        }
    }
    Ok(Response::GroupLag(answer))
}

fn group_lag_to_wire(lag: &malachi_broker::lag::GroupLag) -> GroupLagDescription {
    use malachi_broker::lag::Standing;
    let ranges = lag
        .ranges
        .iter()
        .map(|range| {
            let (standing, position) = match range.standing {
                Standing::At(offset) => (LagStanding::At, offset),
                Standing::Drained => (LagStanding::Drained, 0),
                Standing::Ahead => (LagStanding::Ahead, 0),
            };
            RangeLagDescription {
                range_id: range.range_id,
                state: if range.active { RangeState::Active } else { RangeState::Sealed },
                standing,
                position,
                end: range.end,
                lag: range.lag,
            }
        })
        .collect();
    GroupLagDescription {
        group: text_bytes(&lag.group),
        total: lag.total,
        updated_ms: lag.updated_ms,
        ranges,
    }
}

/// The first of `segments` whose encodings fit in `room_bytes` together.
fn first_fitting(
    mut segments: Vec<SegmentDescription>,
    room_bytes: usize,
) -> Vec<SegmentDescription> {
    let mut used_bytes = 0;
    let fitting = segments
        .iter()
        .take_while(|segment| {
            used_bytes += segment_wire_bytes(segment);
            used_bytes <= room_bytes
        })
        .count();
    segments.truncate(fitting);
    segments
}

fn segment_to_wire(segment: &describe::SegmentDescription) -> SegmentDescription {
    let copies = segment
        .copies
        .iter()
        .map(|copy| CopyDescription {
            node_id: copy.node_id,
            settled: copy.settled,
            answered: copy.state.is_some(),
            durable_offset: copy.state.map_or(0, |state| state.durable_offset),
            sealed: copy.state.is_some_and(|state| state.sealed),
        })
        .collect();
    SegmentDescription {
        range_id: segment.range_id,
        segment_id: segment.segment_id,
        base_records: segment.base_records,
        state: if segment.seal.is_some() { SegmentState::Sealed } else { SegmentState::Active },
        end_offset: segment.seal.map_or(0, |seal| seal.end_offset),
        data_bytes: segment.seal.map_or(0, |seal| seal.data_bytes),
        copies,
    }
}

/// The bytes `segment` takes on the wire.
fn segment_wire_bytes(segment: &SegmentDescription) -> usize {
    SegmentDescription::WIRE_BYTES_MIN + segment.copies.len() * CopyDescription::WIRE_BYTES_MIN
}

async fn create(
    connection: &Connection,
    topic: Option<String>,
    initial_ranges: u32,
) -> Result<Response, String> {
    let topic = topic.ok_or_else(|| Reason::InvalidTopicName.as_str().to_string())?;
    if !connection.permitted(Operation::Produce, &topic) {
        return Err(Reason::PermissionDenied.as_str().to_string());
    }
    let creator = connection.topic_creator();
    connection
        .broker
        .create_topic(&topic, Some(initial_ranges), creator.as_deref())
        .await
        .map(|_| Response::CreateTopicRanges(Empty))
        .map_err(|error| error.reason())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(segment_id: u64, copies: usize) -> SegmentDescription {
        SegmentDescription {
            range_id: 0,
            segment_id,
            base_records: 0,
            state: SegmentState::Active,
            end_offset: 0,
            data_bytes: 0,
            copies: vec![CopyDescription::default(); copies],
        }
    }

    #[test]
    fn a_segments_wire_bytes_are_its_encoding() {
        for copies in [0, 1, 3, 7] {
            let encoded = segment(1, copies).encode_to_bytes().expect("encodes");
            assert_eq!(segment_wire_bytes(&segment(1, copies)), encoded.len(), "{copies} copies");
        }
    }

    #[test]
    fn segments_beyond_the_frame_are_left_off() {
        // Three segments of 3 copies, 96 bytes each. (room_bytes, segment ids kept)
        let cases: &[(usize, &[u64])] =
            &[(1_000, &[1, 2, 3]), (288, &[1, 2, 3]), (287, &[1, 2]), (96, &[1]), (95, &[])];
        for (room_bytes, kept) in cases {
            let segments = (1..=3).map(|segment_id| segment(segment_id, 3)).collect();
            let fitting = first_fitting(segments, *room_bytes);
            let ids: Vec<u64> = fitting.iter().map(|segment| segment.segment_id).collect();
            assert_eq!(ids, *kept, "{room_bytes} bytes");
        }
    }
}
