//! The console's JSON API, which its pages poll: the cluster and its topics at a glance, one
//! topic's range tree with its segments, copies and consumer groups, every group's lag, and
//! the admin actions (split, merge, delete) behind a session, its CSRF token and the same
//! origin. Ids and keyspace points are strings: JavaScript numbers lose integers past 2^53.

use malachi_reason::Reason;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use malachi_broker::describe::SegmentDescription;
use malachi_broker::lag::{GroupLag, Standing};
use malachi_broker::topics::{RangeInfo, TopicInfo};
use serde_json::{Value, json};

use crate::{AppState, Peer};

/// Topics the overview and the group list describe (each costs a look at its heads' ends).
pub const TOPICS_DESCRIBED_MAX: usize = 100;

fn refused(status: StatusCode, reason: &str) -> Response {
    (status, Json(json!({ "error": reason }))).into_response()
}

fn log_error(error: &malachi_broker::error::LogError) -> Response {
    let status = match error.kind() {
        Some(Reason::NoSuchTopic | Reason::NoSuchRange) => StatusCode::NOT_FOUND,
        _ if error.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    refused(status, &error.reason())
}

/// The viewer of a request, if it may see the console.
fn viewer(state: &AppState, headers: &HeaderMap, peer: SocketAddr) -> Option<crate::Viewer> {
    state.viewer(headers, peer.ip()).ok()
}

fn login_required() -> Response {
    refused(StatusCode::UNAUTHORIZED, Reason::LoginRequired.as_str())
}

pub(crate) async fn overview(
    State(state): State<Arc<AppState>>,
    ConnectInfo(Peer { address: peer, .. }): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Response {
    let Some(viewer) = viewer(&state, &headers, peer) else { return login_required() };
    let broker = &state.broker;
    let view = broker.cluster_view();
    let brokers: Vec<Value> = view
        .brokers
        .iter()
        .map(|b| {
            json!({
                "node_id": b.record.node_id.to_string(),
                "status": format!("{:?}", b.status).to_lowercase(),
                "client_address": b.record.client_address,
                "attributes": b.record.attributes,
            })
        })
        .collect();
    let groups: Vec<Value> = view
        .groups
        .iter()
        .map(|g| {
            json!({
                "group_id": g.group_id.to_string(),
                "leader": g.leader.map(|l| l.to_string()),
                "term": g.term,
                "voters": g.voters.iter().map(u64::to_string).collect::<Vec<_>>(),
            })
        })
        .collect();
    let names = broker.list_topics();
    let mut topics = Vec::new();
    for name in names.iter().take(TOPICS_DESCRIBED_MAX) {
        match broker.describe_topic(name).await {
            Ok(info) => topics.push(topic_summary(&info)),
            Err(error) => topics.push(json!({ "name": name, "error": error.reason() })),
        }
    }
    let session = viewer
        .session
        .as_ref()
        .map(|s| json!({ "username": s.username, "admin": s.admin, "csrf": s.csrf }));
    Json(json!({
        "node_id": view.node_id.to_string(),
        "cluster_id": view.cluster_id,
        "now_ms": broker.clock().now_ms(),
        "viewer": session,
        "brokers": brokers,
        "groups": groups,
        "topics": topics,
        "topics_total": names.len(),
        "ready": broker.observer().readiness().err(),
    }))
    .into_response()
}

fn topic_summary(info: &TopicInfo) -> Value {
    let active = info.ranges.iter().filter(|r| r.active).count();
    json!({
        "name": info.name,
        "ranges_active": active,
        "ranges": info.ranges.len(),
        "segments": info.ranges.iter().map(|r| u64::from(r.segments)).sum::<u64>(),
        "records": info.ranges.iter().map(|r| r.records).sum::<u64>(),
        "expired_records": info.ranges.iter().map(|r| r.expired_records).sum::<u64>(),
    })
}

pub(crate) async fn topic(
    State(state): State<Arc<AppState>>,
    ConnectInfo(Peer { address: peer, .. }): ConnectInfo<Peer>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if viewer(&state, &headers, peer).is_none() {
        return login_required();
    }
    let broker = &state.broker;
    let info = match broker.describe_topic(&name).await {
        Ok(info) => info,
        Err(error) => return log_error(&error),
    };
    let segments = broker.observer().describe_segments(&name).await.unwrap_or_default();
    let lags = broker.observer().topic_group_lags(&name).await.unwrap_or_default();
    let ranges: Vec<Value> = info.ranges.iter().map(|range| range_json(range, &segments)).collect();
    Json(json!({
        "name": info.name,
        "topic_id": info.topic_id.to_string(),
        "created_ms": info.created_ms,
        "policy": info.policy,
        "summary": topic_summary(&info),
        "ranges": ranges,
        "groups": lags.iter().map(lag_json).collect::<Vec<_>>(),
    }))
    .into_response()
}

fn range_json(range: &RangeInfo, segments: &[SegmentDescription]) -> Value {
    const KEYSPACE: f64 = 18_446_744_073_709_551_616.0;
    let segments: Vec<Value> = segments
        .iter()
        .filter(|segment| segment.range_id == range.range_id)
        .map(|segment| {
            let copies: Vec<Value> = segment
                .copies
                .iter()
                .map(|copy| {
                    json!({
                        "node_id": copy.node_id.to_string(),
                        "settled": copy.settled,
                        "answered": copy.state.is_some(),
                        "end": copy.state.map(|s| s.durable_offset),
                        "sealed": copy.state.is_some_and(|s| s.sealed),
                    })
                })
                .collect();
            json!({
                "segment_id": segment.segment_id.to_string(),
                "base": segment.base_records,
                "sealed": segment.seal.is_some(),
                "end_offset": segment.seal.map(|s| s.end_offset),
                "data_bytes": segment.seal.map(|s| s.data_bytes),
                "copies": copies,
            })
        })
        .collect();
    json!({
        "range_id": range.range_id,
        "start": format!("{:016x}", range.start),
        "end_inclusive": format!("{:016x}", range.end_inclusive),
        "start_fraction": range.start as f64 / KEYSPACE,
        "end_fraction": (range.end_inclusive as f64 + 1.0) / KEYSPACE,
        "active": range.active,
        "parents": range.parents,
        "children": range.children,
        "records": range.records,
        "expired_records": range.expired_records,
        "segments": segments,
    })
}

fn lag_json(lag: &GroupLag) -> Value {
    let ranges: Vec<Value> = lag
        .ranges
        .iter()
        .map(|range| {
            let (standing, position) = match range.standing {
                Standing::At(offset) => ("at", Some(offset)),
                Standing::Drained => ("drained", None),
                Standing::Ahead => ("ahead", None),
            };
            json!({
                "range_id": range.range_id,
                "active": range.active,
                "standing": standing,
                "position": position,
                "end": range.end,
                "lag": range.lag,
            })
        })
        .collect();
    json!({
        "topic": lag.topic,
        "group": lag.group,
        "total": lag.total,
        "updated_ms": lag.updated_ms,
        "ranges": ranges,
    })
}

pub(crate) async fn groups(
    State(state): State<Arc<AppState>>,
    ConnectInfo(Peer { address: peer, .. }): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Response {
    if viewer(&state, &headers, peer).is_none() {
        return login_required();
    }
    let broker = &state.broker;
    let mut groups = Vec::new();
    for name in broker.list_topics().iter().take(TOPICS_DESCRIBED_MAX) {
        if let Ok(lags) = broker.observer().topic_group_lags(name).await {
            groups.extend(lags.iter().map(|lag| {
                json!({
                    "topic": lag.topic,
                    "group": lag.group,
                    "total": lag.total,
                    "updated_ms": lag.updated_ms,
                })
            }));
        }
    }
    Json(json!({ "groups": groups })).into_response()
}

#[derive(serde::Deserialize)]
pub(crate) struct SplitBody {
    range_id: u32,
}

#[derive(serde::Deserialize)]
pub(crate) struct MergeBody {
    left: u32,
    right: u32,
}

pub(crate) async fn split(
    State(state): State<Arc<AppState>>,
    ConnectInfo(Peer { address: peer, .. }): ConnectInfo<Peer>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Json(body): Json<SplitBody>,
) -> Response {
    let actor = match state.actor(&headers, peer.ip()) {
        Ok(actor) => actor,
        Err((status, reason)) => return refused(status, reason),
    };
    match state.broker.split(&name, body.range_id).await {
        Ok([low, high]) => {
            tracing::info!(user = %actor.username, topic = %name, range = body.range_id, "console: split");
            Json(json!({ "low": low, "high": high })).into_response()
        }
        Err(error) => log_error(&error),
    }
}

pub(crate) async fn merge(
    State(state): State<Arc<AppState>>,
    ConnectInfo(Peer { address: peer, .. }): ConnectInfo<Peer>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Json(body): Json<MergeBody>,
) -> Response {
    let actor = match state.actor(&headers, peer.ip()) {
        Ok(actor) => actor,
        Err((status, reason)) => return refused(status, reason),
    };
    match state.broker.merge(&name, body.left, body.right).await {
        Ok(range_id) => {
            tracing::info!(user = %actor.username, topic = %name, range_id, "console: merge");
            Json(json!({ "range_id": range_id })).into_response()
        }
        Err(error) => log_error(&error),
    }
}

pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    ConnectInfo(Peer { address: peer, .. }): ConnectInfo<Peer>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let actor = match state.actor(&headers, peer.ip()) {
        Ok(actor) => actor,
        Err((status, reason)) => return refused(status, reason),
    };
    match state.broker.delete_topic(&name).await {
        Ok(()) => {
            tracing::info!(user = %actor.username, topic = %name, "console: delete topic");
            Json(json!({ "deleted": name })).into_response()
        }
        Err(error) => log_error(&error),
    }
}
