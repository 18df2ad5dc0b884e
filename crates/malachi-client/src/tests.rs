//! The client against [`FakeServer`] scripts: pipelining, login, timeouts, `corr` allocation,
//! connection errors, subscriptions and the consumer's commits. Timeouts are short (tens of
//! milliseconds) so the whole file runs in well under a second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_wire::messages::*;
use malachi_wire::{Reason, Record, Request, Response, ResponseFrame};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::fake_server::{FakeConnection, FakeServer};
use crate::{
    Client, ClientConfig, ClientError, Consumer, ConsumerOptions, FetchOptions, RecordBuilder,
    SubscribeOptions,
};

fn config(server: &FakeServer) -> ClientConfig {
    ClientConfig::new(server.address.clone())
        .credentials("app", "app123")
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(5))
}

fn records(count: usize) -> Vec<Record> {
    (0..count).map(|index| RecordBuilder::new(index.to_string()).build()).collect()
}

fn bytes(text: &'static str) -> Bytes {
    Bytes::from_static(text.as_bytes())
}

#[tokio::test]
async fn pipelined_answers_out_of_order_are_matched_by_corr() {
    const REQUESTS: usize = 64;
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        connection.accept_login().await;
        let mut received = Vec::new();
        while received.len() < REQUESTS {
            received.push(connection.recv().await.expect("all requests arrive"));
        }
        // Answer in reverse order of arrival: only the corr can match them.
        for frame in received.into_iter().rev() {
            let Request::Produce(produce) = frame.request else { panic!("a produce") };
            let count = u32::try_from(produce.records.len()).expect("small");
            connection.reply(frame.corr, Response::Produce(ProduceResponse { count })).await;
        }
    })
    .await;
    let client = Arc::new(Client::connect(config(&server)).await.expect("connects"));
    assert_eq!(client.token(), Some("tok_abc"));
    let mut calls = JoinSet::new();
    for count in 0..REQUESTS {
        let client = Arc::clone(&client);
        calls.spawn(async move { (count, client.produce("orders", records(count)).await) });
    }
    while let Some(result) = calls.join_next().await {
        let (count, answer) = result.expect("the task ran");
        assert_eq!(answer.expect("answered"), u32::try_from(count).expect("small"));
    }
    assert_eq!(server.connections_accepted(), 1, "every request shared one connection");
}

#[tokio::test]
async fn a_refused_login_is_the_servers_reason() {
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        let frame = connection.recv().await.expect("a login");
        connection.refuse(frame.corr, "invalid_credentials").await;
        // The server closes after a failed login (section 5).
    })
    .await;
    let error = Client::connect(config(&server)).await.expect_err("refused");
    assert_eq!(error.reason(), Some(Reason::InvalidCredentials));
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn a_connection_error_on_corr_0_reaches_the_waiters() {
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        connection.recv().await.expect("a login");
        connection.send(ResponseFrame::error(0, Reason::ConnectionLimitExceeded)).await;
    })
    .await;
    let error = Client::connect(config(&server)).await.expect_err("refused");
    assert_eq!(error.reason(), Some(Reason::ConnectionLimitExceeded), "{error:?}");
    assert!(error.is_retryable());
}

#[tokio::test]
async fn timeouts_leave_the_connection_usable() {
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        connection.accept_login().await;
        let fetch = connection.recv().await.expect("the fetch");
        let produce = connection.recv().await.expect("the produce, sent after the timeout");
        // The fetch's answer comes too late: the client must drop it.
        let late = FetchResponse { records: records(1), next_cursor: bytes("late") };
        connection.reply(fetch.corr, Response::Fetch(late)).await;
        connection.reply(produce.corr, Response::Produce(ProduceResponse { count: 7 })).await;
    })
    .await;
    let config = config(&server).request_timeout(Duration::from_millis(40));
    let client = Client::connect(config).await.expect("connects");
    let started = Instant::now();
    let options = FetchOptions { wait_ms: 30, ..FetchOptions::default() };
    let error = client.fetch("orders", &options).await.expect_err("no answer in time");
    assert!(matches!(error, ClientError::Timeout), "{error:?}");
    assert!(started.elapsed() >= Duration::from_millis(70), "a fetch's timeout adds wait_ms");
    assert_eq!(client.produce("orders", records(7)).await.expect("answered"), 7);
}

#[tokio::test]
async fn connect_times_out_when_the_login_is_not_answered() {
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        connection.recv().await;
        connection.recv().await;
    })
    .await;
    let config = config(&server).connect_timeout(Duration::from_millis(30));
    let error = Client::connect(config).await.expect_err("no answer");
    assert!(matches!(error, ClientError::Timeout), "{error:?}");
}

/// Answers every create_topic at once and reports the corrs it saw.
async fn corr_reporter(corrs: mpsc::UnboundedSender<u32>) -> FakeServer {
    FakeServer::start(move |mut connection: FakeConnection| {
        let corrs = corrs.clone();
        async move {
            connection.accept_login().await;
            while let Some(frame) = connection.recv().await {
                corrs.send(frame.corr).expect("the test listens");
                if let Request::CreateTopic(_) = frame.request {
                    connection.reply(frame.corr, Response::CreateTopic(Empty)).await;
                }
            }
        }
    })
    .await
}

#[tokio::test]
async fn corr_wraps_from_max_to_1_never_0() {
    let (sender, mut corrs) = mpsc::unbounded_channel();
    let server = corr_reporter(sender).await;
    let client = Client::connect(config(&server)).await.expect("connects");
    client.set_next_corr(u32::MAX - 1);
    for _ in 0..3 {
        client.create_topic("orders").await.expect("answered");
    }
    let mut seen = Vec::new();
    while let Ok(corr) = corrs.try_recv() {
        seen.push(corr);
    }
    assert_eq!(seen, [u32::MAX - 1, u32::MAX, 1]);
}

#[tokio::test]
async fn corr_skips_one_still_waiting() {
    let (sender, mut corrs) = mpsc::unbounded_channel();
    let server = corr_reporter(sender).await;
    let client = Arc::new(Client::connect(config(&server)).await.expect("connects"));
    // corr 1 was the login; the fetch takes 2 and is never answered.
    let waiting = Arc::clone(&client);
    let fetch = tokio::spawn(async move { waiting.fetch("t", &FetchOptions::default()).await });
    assert_eq!(corrs.recv().await, Some(2));
    client.set_next_corr(2);
    client.create_topic("orders").await.expect("answered");
    assert_eq!(corrs.recv().await, Some(3), "2 is still waiting for its answer");
    fetch.abort();
}

#[tokio::test]
async fn frames_for_unknown_corrs_are_dropped() {
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        connection.accept_login().await;
        let frame = connection.recv().await.expect("a list_topics");
        connection.reply(999, Response::CreateTopic(Empty)).await;
        connection.send(ResponseFrame::ok(0, Response::CreateTopic(Empty))).await;
        let topics = vec![Some(bytes("orders"))];
        connection.reply(frame.corr, Response::ListTopics(ListTopicsResponse { topics })).await;
    })
    .await;
    let client = Client::connect(config(&server)).await.expect("connects");
    assert_eq!(client.list_topics().await.expect("answered"), ["orders"]);
}

#[tokio::test]
async fn describe_segments_asks_for_the_topic_and_returns_the_answer() {
    let copy = CopyDescription {
        node_id: 2,
        settled: false,
        answered: true,
        durable_offset: 4,
        sealed: false,
    };
    let head = SegmentDescription {
        range_id: 0,
        segment_id: 5,
        base_records: 10,
        state: SegmentState::Active,
        end_offset: 0,
        data_bytes: 0,
        copies: vec![copy],
    };
    let answer = DescribeSegmentsResponse { topic: Some(bytes("orders")), segments: vec![head] };
    let served = answer.clone();
    let server = FakeServer::start(move |mut connection: FakeConnection| {
        let served = served.clone();
        async move {
            connection.accept_login().await;
            let frame = connection.recv().await.expect("a describe_segments");
            let asked = DescribeSegmentsRequest { topic: Some(bytes("orders")) };
            assert_eq!(frame.request, Request::DescribeSegments(asked));
            connection.reply(frame.corr, Response::DescribeSegments(served)).await;
        }
    })
    .await;
    let client = Client::connect(config(&server)).await.expect("connects");
    assert_eq!(client.describe_segments("orders").await.expect("answered"), answer);
}

#[tokio::test]
async fn a_closed_connection_fails_every_call() {
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        connection.accept_login().await;
        connection.recv().await.expect("a produce");
        // Dropping the connection closes it without an answer.
    })
    .await;
    let client = Client::connect(config(&server)).await.expect("connects");
    let error = client.produce("orders", records(1)).await.expect_err("closed");
    assert!(matches!(error, ClientError::Closed | ClientError::Transport(_)), "{error:?}");
    assert!(client.is_closed());
    let later = client.list_topics().await.expect_err("still closed");
    assert!(later.is_retryable(), "on a new connection");
}

#[tokio::test]
async fn server_errors_keep_their_text() {
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        connection.accept_login().await;
        let frame = connection.recv().await.expect("a delete_policy");
        connection.refuse(frame.corr, "policy_in_use: orders, audit").await;
    })
    .await;
    let client = Client::connect(config(&server)).await.expect("connects");
    let error = client.delete_policy("short", false).await.expect_err("refused");
    assert_eq!(error.reason(), Some(Reason::PolicyInUse));
    assert_eq!(error.to_string(), "policy_in_use: orders, audit");
}

#[tokio::test]
async fn a_subscription_yields_pushes_and_sends_acks() {
    let (acks, mut acked) = mpsc::unbounded_channel();
    let server = FakeServer::start(move |mut connection: FakeConnection| {
        let acks = acks.clone();
        async move {
            connection.accept_login().await;
            let subscribe = connection.recv().await.expect("a subscribe");
            let Request::Subscribe(request) = &subscribe.request else { panic!("subscribe") };
            assert_eq!(request.group, Some(bytes("live")));
            let push = |records, cursor| {
                Response::Subscribe(FetchResponse { records, next_cursor: bytes(cursor) })
            };
            connection.reply(subscribe.corr, push(records(1), "c1")).await;
            connection.reply(subscribe.corr, push(Vec::new(), "c1")).await;
            connection.reply(subscribe.corr, push(records(2), "c2")).await;
            let ack = connection.recv().await.expect("a stream_ack");
            acks.send(ack.request).expect("the test listens");
        }
    })
    .await;
    let client = Client::connect(config(&server)).await.expect("connects");
    let options = SubscribeOptions { group: Some("live".into()), ..SubscribeOptions::default() };
    let mut subscription = client.subscribe("orders", &options).await.expect("subscribed");
    let (first, cursor) = subscription.next().await.expect("a push");
    assert_eq!((first.len(), &cursor[..]), (1, &b"c1"[..]));
    subscription.ack(&cursor, 1).await.expect("sent");
    let (second, cursor) = subscription.next().await.expect("the empty push is skipped");
    assert_eq!((second.len(), &cursor[..]), (2, &b"c2"[..]));
    let expected = StreamAckRequest {
        topic: Some(bytes("orders")),
        group: Some(bytes("live")),
        member: None,
        cursor: Some(bytes("c1")),
        count: 1,
    };
    assert_eq!(acked.recv().await, Some(Request::StreamAck(expected)));
}

#[tokio::test]
async fn a_refused_subscription_is_its_first_item() {
    let server = FakeServer::start(|mut connection: FakeConnection| async move {
        connection.accept_login().await;
        let subscribe = connection.recv().await.expect("a subscribe");
        connection.refuse(subscribe.corr, "permission_denied").await;
        connection.recv().await;
    })
    .await;
    let client = Client::connect(config(&server)).await.expect("connects");
    let mut subscription =
        client.subscribe("orders", &SubscribeOptions::default()).await.expect("sent");
    let error = subscription.next().await.expect_err("refused");
    assert_eq!(error.reason(), Some(Reason::PermissionDenied));
}

#[tokio::test]
async fn the_consumer_commits_each_page_once_it_is_processed() {
    let (events, mut seen) = mpsc::unbounded_channel();
    let server = FakeServer::start(move |mut connection: FakeConnection| {
        let events = events.clone();
        async move {
            connection.accept_login().await;
            while let Some(frame) = connection.recv().await {
                let response = match frame.request {
                    Request::Fetch(fetch) => {
                        let cursor = fetch.cursor.clone().unwrap_or_else(|| bytes("0"));
                        events
                            .send(format!("fetch {cursor:?} {:?}", fetch.group))
                            .expect("listens");
                        let (count, next) = match &cursor[..] {
                            b"0" => (2, "1"),
                            b"1" => (1, "2"),
                            _ => (0, "2"),
                        };
                        let page =
                            FetchResponse { records: records(count), next_cursor: bytes(next) };
                        Response::Fetch(page)
                    }
                    Request::Commit(commit) => {
                        events.send(format!("commit {:?}", commit.cursor)).expect("listens");
                        Response::Commit(Empty)
                    }
                    other => panic!("unexpected {other:?}"),
                };
                connection.reply(frame.corr, response).await;
            }
        }
    })
    .await;
    let client = Client::connect(config(&server)).await.expect("connects");
    let options =
        ConsumerOptions { group: Some("g1".into()), commit: true, ..ConsumerOptions::default() };
    let mut consumer = Consumer::new(&client, "orders", options);
    let sizes = [
        consumer.next_page().await.expect("page").len(),
        consumer.next_page().await.expect("page").len(),
        consumer.next_page().await.expect("page").len(),
    ];
    consumer.commit().await.expect("nothing new to commit");
    assert_eq!(sizes, [2, 1, 0]);
    drop(client);
    let mut log = Vec::new();
    while let Some(event) = seen.recv().await {
        log.push(event);
        if log.len() == 5 {
            break;
        }
    }
    let group = "Some(b\"g1\")";
    let expected = [
        format!("fetch b\"0\" {group}"),
        "commit Some(b\"1\")".to_string(),
        format!("fetch b\"1\" {group}"),
        "commit Some(b\"2\")".to_string(),
        format!("fetch b\"2\" {group}"),
    ];
    assert_eq!(log, expected);
}
