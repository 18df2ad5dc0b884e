//! Malachi's own keys 64-71 (`docs/protocol.md`): topic listing, describe, delete, split, merge,
//! and create with an initial range count. The original protocol has no keys for these.

use malachi_meta::Operation;
use malachi_wire::messages::{
    ClusterBroker, ClusterGroup, ClusterStatusResponse, DescribeTopicResponse, Empty,
    ListTopicsResponse, MergeRangesResponse, RangeDescription, RangeState, SplitRangeResponse,
};
use malachi_wire::{Reason, Request, Response};

use crate::connection::{Connection, Outcome};
use crate::convert::{text, text_bytes};

pub(crate) async fn handle(connection: &mut Connection, corr: u32, request: Request) -> Outcome {
    let outcome = match request {
        Request::ListTopics(_) => Ok(list_topics(connection)),
        Request::DescribeTopic(request) => describe(connection, text(&request.topic)).await,
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
            match connection.broker.decommission(request.node_id, request.force).await {
                Ok(()) => Ok(Response::RemoveBroker(Empty)),
                Err(error) => {
                    tracing::info!(node_id = request.node_id, %error, "remove_broker refused");
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

async fn describe(connection: &Connection, topic: Option<String>) -> Result<Response, String> {
    let topic = topic.ok_or_else(|| Reason::NoSuchTopic.as_str().to_string())?;
    if !connection.permitted(Operation::Consume, &topic)
        && !connection.permitted(Operation::Produce, &topic)
    {
        return Err(Reason::PermissionDenied.as_str().to_string());
    }
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
