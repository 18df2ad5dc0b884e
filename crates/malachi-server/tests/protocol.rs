//! The protocol over a real socket: auth rules, limits, permissions, malformed input,
//! subscriptions.

mod harness;

use bytes::Bytes;
use harness::{WireClient, auth, reason, start, text};
use malachi_wire::messages::{
    AclRequest, CopyDescription, CreateTopicRequest, DescribeSegmentsRequest, FetchRequest,
    GroupLagRequest, ProduceRequest, SegmentState, StreamAckRequest, SubscribeRequest,
};
use malachi_wire::{Expect, Record, Request, Response, ResponseBody};
use proptest::prelude::*;

fn produce(topic: &str, values: &[&str]) -> Request {
    let records = values
        .iter()
        .map(|value| Record {
            key: text(value),
            value: Bytes::from(value.to_string()),
            timestamp_ms: 1,
            headers: vec![],
        })
        .collect();
    Request::Produce(ProduceRequest { topic: text(topic), records })
}

fn create(topic: &str) -> Request {
    Request::CreateTopic(CreateTopicRequest { topic: text(topic), keyspace_bits: 8 })
}

fn fetch(topic: &str, cursor: Option<Bytes>) -> Request {
    Request::Fetch(FetchRequest {
        topic: text(topic),
        cursor,
        group: None,
        member: None,
        max_records: 100,
        wait_ms: 0,
    })
}

fn fetched(frame: &malachi_wire::ResponseFrame) -> (usize, Bytes) {
    match &frame.body {
        ResponseBody::Ok(Response::Fetch(page)) | ResponseBody::Ok(Response::Subscribe(page)) => {
            (page.records.len(), page.next_cursor.clone())
        }
        other => panic!("expected a page, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_logins_are_indistinguishable_and_close_the_connection() {
    let server = start(&[]).await;
    for (user, password) in [("app", "wrong"), ("nobody", "app123")] {
        let mut client = WireClient::connect(server.address).await;
        let answer = client.call(auth(user, password)).await.unwrap();
        assert_eq!(reason(&answer), "invalid_credentials", "{user}");
        assert!(client.is_closed().await, "one attempt per connection");
    }
    let mut client = WireClient::connect(server.address).await;
    let answer = client.call(create("orders")).await.unwrap();
    assert_eq!((answer.corr, reason(&answer).as_str()), (1, "auth_required"));
    assert!(client.is_closed().await);
    let mut client = WireClient::connect(server.address).await;
    client.send_raw(&[0, 0, 0, 3, 0, 2, 0]).await;
    let answer = client.recv(Expect::Reply(malachi_wire::ApiKey::Auth)).await.unwrap();
    assert_eq!((answer.corr, reason(&answer).as_str()), (0, "auth_required"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_rate_limit_and_lockout() {
    let server = start(&[("AUTH_RATE_LIMIT", "3")]).await;
    let mut reasons = Vec::new();
    for _ in 0..4 {
        let mut client = WireClient::connect(server.address).await;
        reasons.push(reason(&client.call(auth("app", "wrong")).await.unwrap()));
    }
    assert_eq!(
        reasons,
        [
            "invalid_credentials",
            "invalid_credentials",
            "invalid_credentials",
            "rate_limit_exceeded"
        ]
    );

    let server = start(&[("AUTH_RATE_LIMIT", "100")]).await;
    for _ in 0..5 {
        let mut client = WireClient::connect(server.address).await;
        client.call(auth("app", "wrong")).await.unwrap();
    }
    let mut client = WireClient::connect(server.address).await;
    let answer = client.call(auth("app", "app123")).await.unwrap();
    assert_eq!(reason(&answer), "account_locked", "five failures lock even the right password out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_and_acls_are_enforced() {
    let server = start(&[("ACL_STRICT", "true")]).await;
    let mut consumer = WireClient::login(server.address, "consumer", "consumer123").await;
    let mut admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    admin.call(create("orders")).await.unwrap();
    assert_eq!(
        reason(&consumer.call(produce("orders", &["a"])).await.unwrap()),
        "permission_denied"
    );
    assert_eq!(
        reason(&consumer.call(fetch("orders", None)).await.unwrap()),
        "permission_denied",
        "strict mode needs a grant"
    );
    let grant = Request::GrantAcl(AclRequest {
        username: text("consumer"),
        operation: text("consume"),
        pattern: text("ord*"),
    });
    assert!(matches!(admin.call(grant).await.unwrap().body, ResponseBody::Ok(_)));
    assert!(matches!(
        consumer.call(fetch("orders", None)).await.unwrap().body,
        ResponseBody::Ok(_)
    ));
    let list_users = Request::ListUsers(malachi_wire::messages::IgnoredPayload);
    assert_eq!(reason(&consumer.call(list_users).await.unwrap()), "permission_denied");
}

/// Every administrative key (cluster drain and removal among them) sent by a user who is not an
/// admin is refused `permission_denied` before its payload is read (wire-protocol.md 3.0),
/// whatever the payload holds, and the connection stays open for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_key_is_refused_to_a_user_who_is_not_admin() {
    let server = start(&[]).await;
    let mut app = WireClient::login(server.address, "app", "app123").await;
    let admin_keys: Vec<malachi_wire::ApiKey> =
        malachi_wire::ApiKey::ALL.iter().copied().filter(|key| key.requires_admin()).collect();
    assert!(admin_keys.contains(&malachi_wire::ApiKey::DrainBroker));
    assert!(admin_keys.contains(&malachi_wire::ApiKey::RemoveBroker));
    for (corr, key) in (100u32..).zip(admin_keys) {
        let mut body = key.as_u16().to_be_bytes().to_vec();
        body.extend_from_slice(&corr.to_be_bytes());
        body.extend_from_slice(b"not a payload of any request");
        let mut frame = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        app.send_raw(&frame).await;
        let answer = app.recv(Expect::Reply(key)).await.expect("an answer");
        assert_eq!((answer.corr, reason(&answer).as_str()), (corr, "permission_denied"), "{key}");
    }
    let listed = app.call(Request::ListTopics(malachi_wire::messages::Empty)).await;
    assert!(matches!(listed.unwrap().body, ResponseBody::Ok(_)), "the connection stays usable");
}

fn describe_segments(topic: &str) -> Request {
    Request::DescribeSegments(DescribeSegmentsRequest { topic: text(topic) })
}

fn described(frame: &malachi_wire::ResponseFrame) -> &[malachi_wire::messages::SegmentDescription] {
    match &frame.body {
        ResponseBody::Ok(Response::DescribeSegments(answer)) => &answer.segments,
        other => panic!("expected segments, got {other:?}"),
    }
}

/// Key 72 asks what describe_topic asks (produce or consume on the topic) and shows the one
/// copy of a broker alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_segments_needs_a_grant_and_shows_each_copy() {
    let server = start(&[("ACL_STRICT", "true")]).await;
    let mut consumer = WireClient::login(server.address, "consumer", "consumer123").await;
    let mut admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    admin.call(create("orders")).await.unwrap();
    admin.call(produce("orders", &["a", "b", "c"])).await.unwrap();
    let refused = consumer.call(describe_segments("orders")).await.unwrap();
    assert_eq!(reason(&refused), "permission_denied");
    let grant = Request::GrantAcl(AclRequest {
        username: text("consumer"),
        operation: text("consume"),
        pattern: text("orders"),
    });
    assert!(matches!(admin.call(grant).await.unwrap().body, ResponseBody::Ok(_)));
    let answer = consumer.call(describe_segments("orders")).await.unwrap();
    let [head] = described(&answer) else { panic!("one segment: {answer:?}") };
    assert_eq!((head.range_id, head.base_records, head.state), (0, 0, SegmentState::Active));
    let copy = CopyDescription {
        node_id: 1,
        settled: false,
        answered: true,
        durable_offset: 3,
        sealed: false,
    };
    assert_eq!(head.copies, [copy]);
    let absent = admin.call(describe_segments("absent")).await.unwrap();
    assert_eq!(reason(&absent), "no_such_topic");
}

fn group_lag(topic: &str, group: Option<&str>) -> Request {
    Request::GroupLag(GroupLagRequest { topic: text(topic), group: group.and_then(text) })
}

/// (group, total lag) of each group a key 73 answer holds.
fn lags(frame: &malachi_wire::ResponseFrame) -> Vec<(String, u64)> {
    match &frame.body {
        ResponseBody::Ok(Response::GroupLag(answer)) => answer
            .groups
            .iter()
            .map(|g| {
                (String::from_utf8_lossy(g.group.as_deref().unwrap_or_default()).into(), g.total)
            })
            .collect(),
        other => panic!("expected lags, got {other:?}"),
    }
}

/// Key 73 needs consume on the topic, and counts what each group has yet to read: a group that
/// read 2 of 5 records is 3 behind, one that never committed all 5, and a commit moves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_lag_counts_what_each_group_has_left() {
    let server = start(&[("ACL_STRICT", "true")]).await;
    let mut consumer = WireClient::login(server.address, "consumer", "consumer123").await;
    let mut admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    admin.call(create("orders")).await.unwrap();
    admin.call(produce("orders", &["a", "b", "c", "d", "e"])).await.unwrap();
    let read = |max| malachi_broker::fetch::FetchArgs {
        topic: "orders",
        cursor: None,
        group: None,
        member: None,
        max,
        wait_ms: 0,
        total_max: None,
    };
    let page = server.broker.fetch(&read(2)).await.unwrap();
    let cursor = page.next_cursor.clone();
    server.broker.groups().commit("orders", "billing", Some(cursor.as_bytes())).await.unwrap();
    assert_eq!(
        reason(&consumer.call(group_lag("orders", None)).await.unwrap()),
        "permission_denied"
    );
    let grant = Request::GrantAcl(AclRequest {
        username: text("consumer"),
        operation: text("consume"),
        pattern: text("orders"),
    });
    assert!(matches!(admin.call(grant).await.unwrap().body, ResponseBody::Ok(_)));
    // (group asked for, expected (group, total lag) rows)
    type Case<'a> = (Option<&'a str>, Vec<(&'a str, u64)>);
    let cases: &[Case] = &[
        (None, vec![("billing", 3)]),
        (Some("billing"), vec![("billing", 3)]),
        (Some("never"), vec![("never", 5)]),
    ];
    for (group, expected) in cases {
        let answer = consumer.call(group_lag("orders", *group)).await.unwrap();
        let expected: Vec<(String, u64)> =
            expected.iter().map(|(name, lag)| (name.to_string(), *lag)).collect();
        assert_eq!(lags(&answer), expected, "{group:?}");
    }
    let page = server.broker.fetch(&read(100)).await.unwrap();
    server
        .broker
        .groups()
        .commit("orders", "billing", Some(page.next_cursor.as_bytes()))
        .await
        .unwrap();
    let answer = consumer.call(group_lag("orders", Some("billing"))).await.unwrap();
    assert_eq!(lags(&answer), vec![("billing".to_string(), 0)], "caught up");
    let absent = admin.call(group_lag("absent", None)).await.unwrap();
    assert_eq!(reason(&absent), "no_such_topic");
}

/// An answer holds only the segments that fit in one frame, the first ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_segments_is_cut_to_the_frame() {
    let server = start(&[("MAX_FRAME_SIZE", "1024"), ("AUTO_SPLIT_ENABLED", "false")]).await;
    let mut admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    admin.call(create("many")).await.unwrap();
    let topic_id = server.broker.describe_topic("many").await.unwrap().topic_id;
    for _ in 0..20 {
        admin.call(produce("many", &["r"])).await.unwrap();
        server.broker.roll(topic_id, 0).await.unwrap();
    }
    let all = server.broker.observer().describe_segments("many").await.unwrap();
    assert_eq!(all.len(), 21);
    // 1024 bytes less the envelope (6), the topic (9) and the count (4) hold 17 segments of
    // one copy (58 bytes each).
    let answer = admin.call(describe_segments("many")).await.unwrap();
    let ids: Vec<u64> = described(&answer).iter().map(|segment| segment.segment_id).collect();
    let first: Vec<u64> = all.iter().take(17).map(|segment| segment.segment_id).collect();
    assert_eq!(ids, first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_and_frame_limits() {
    let server = start(&[("MAX_CONN_PER_IP", "2"), ("MAX_FRAME_SIZE", "4096")]).await;
    let mut first = WireClient::login(server.address, "app", "app123").await;
    // Logged in, so its slot is surely taken before the third connects (a bare connect may
    // still be in the accept queue when the third is admitted, under load).
    let _second = WireClient::login(server.address, "app", "app123").await;
    let mut third = WireClient::connect(server.address).await;
    let refused = third.recv(Expect::Reply(malachi_wire::ApiKey::Auth)).await.unwrap();
    assert_eq!((refused.corr, reason(&refused).as_str()), (0, "connection_limit_exceeded"));
    // A frame of exactly the limit is read (and is malformed); one byte more closes.
    let mut exact = vec![0u8; 4 + 4096];
    exact[..4].copy_from_slice(&4096u32.to_be_bytes());
    exact[4..6].copy_from_slice(&2u16.to_be_bytes());
    first.send_raw(&exact).await;
    let answer = first.recv(Expect::Reply(malachi_wire::ApiKey::Produce)).await.unwrap();
    assert_eq!(reason(&answer), "malformed_request");
    first.send_raw(&4097u32.to_be_bytes()).await;
    let answer = first.recv(Expect::Reply(malachi_wire::ApiKey::Produce)).await.unwrap();
    assert_eq!((answer.corr, reason(&answer).as_str()), (0, "frame_too_large"));
    assert!(first.is_closed().await);
}

/// Connections that never log in are bounded (`MALACHI_MAX_UNAUTHENTICATED_CONN`) whatever the
/// other limits: of three strangers against a bound of two, exactly one is answered
/// `overloaded` (the others time out unanswered), and logged-in connections take no place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_log_in_are_bounded() {
    let settings = [
        ("MAX_UNAUTHENTICATED_CONN", "2"),
        ("CONNECTION_LIMIT_ENABLED", "false"),
        ("AUTH_TIMEOUT_MS", "1000"),
    ];
    let server = start(&settings).await;
    let mut logged_in = [
        WireClient::login(server.address, "app", "app123").await,
        WireClient::login(server.address, "app", "app123").await,
    ];
    // A request answered after the login proves the server has moved the connection on.
    for client in &mut logged_in {
        let answer = client.call(Request::ListUsers(malachi_wire::messages::IgnoredPayload)).await;
        assert_eq!(reason(&answer.unwrap()), "permission_denied");
    }
    let mut strangers = Vec::new();
    for _ in 0..3 {
        strangers.push(WireClient::connect(server.address).await);
    }
    let mut answers = Vec::new();
    for stranger in &mut strangers {
        let answer = stranger.recv(Expect::Reply(malachi_wire::ApiKey::Auth)).await;
        answers.push(answer.map(|frame| reason(&frame)));
    }
    let refused = answers.iter().filter(|answer| answer.as_deref() == Some("overloaded")).count();
    let timed_out = answers.iter().filter(|answer| answer.is_none()).count();
    assert_eq!((refused, timed_out), (1, 2), "{answers:?}");
}

/// Before login a frame is at most 16 KiB, whatever the configured limit: a stranger announcing
/// megabytes is refused at the length prefix, before any of it is buffered; after login the
/// configured limit applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_make_the_broker_buffer_a_large_first_frame() {
    let server = start(&[]).await;
    for announced in [16 * 1024 + 1, 16 * 1024 * 1024] {
        let mut stranger = WireClient::connect(server.address).await;
        stranger.send_raw(&u32::to_be_bytes(announced)).await;
        stranger.send_raw(&vec![0u8; 64 * 1024]).await;
        let answer = stranger.recv(Expect::Reply(malachi_wire::ApiKey::Auth)).await.unwrap();
        assert_eq!((answer.corr, reason(&answer).as_str()), (0, "frame_too_large"), "{announced}");
        assert!(stranger.is_closed().await);
    }
    // A logged-in client may send frames up to the configured limit (16 MiB by default).
    let mut client = WireClient::login(server.address, "app", "app123").await;
    let mut large = vec![0u8; 4 + 100_000];
    large[..4].copy_from_slice(&100_000u32.to_be_bytes());
    large[4..6].copy_from_slice(&2u16.to_be_bytes());
    client.send_raw(&large).await;
    let answer = client.recv(Expect::Reply(malachi_wire::ApiKey::Produce)).await.unwrap();
    assert_eq!(reason(&answer), "malformed_request", "read whole, then refused as a request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_push_within_their_credit() {
    let server = start(&[]).await;
    let mut producer = WireClient::login(server.address, "app", "app123").await;
    producer.call(create("live")).await.unwrap();
    producer.call(produce("live", &["a", "b", "c", "d", "e"])).await.unwrap();
    let mut subscriber = WireClient::login(server.address, "app", "app123").await;
    let subscribe = Request::Subscribe(SubscribeRequest {
        topic: text("live"),
        group: text("g"),
        member: None,
        window_records: 2,
        max_records: 10,
    });
    let corr = subscriber.send(subscribe).await;
    let push = subscriber.recv(Expect::Reply(malachi_wire::ApiKey::Subscribe)).await.unwrap();
    assert_eq!(push.corr, corr);
    let (count, cursor) = fetched(&push);
    assert_eq!(count, 2, "a push never exceeds the window");
    // Anything but stream_ack is unexpected; the subscription continues.
    let other = subscriber.send(fetch("live", None)).await;
    let answer = subscriber.recv(Expect::Reply(malachi_wire::ApiKey::Fetch)).await.unwrap();
    assert_eq!((answer.corr, reason(&answer).as_str()), (other, "unexpected_frame"));
    let ack = Request::StreamAck(StreamAckRequest {
        topic: text("live"),
        group: text("g"),
        member: None,
        cursor: Some(cursor),
        count: 2,
    });
    subscriber.send(ack).await;
    let (count, _) =
        fetched(&subscriber.recv(Expect::Reply(malachi_wire::ApiKey::Subscribe)).await.unwrap());
    assert_eq!(count, 2, "credit returned by the ack");
    producer.call(produce("live", &["f"])).await.unwrap();
    // The acked position was committed for the group: a plain group fetch starts after it.
    let group_fetch = Request::Fetch(FetchRequest {
        topic: text("live"),
        cursor: None,
        group: text("g"),
        member: None,
        max_records: 100,
        wait_ms: 0,
    });
    let (remaining, _) = fetched(&producer.call(group_fetch).await.unwrap());
    assert_eq!(remaining, 4, "records c..f remain after the committed two");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random and truncated frames on an authenticated connection: the server answers or
    /// closes, never dies, and a well-formed client is served afterwards.
    #[test]
    fn garbage_never_hurts_the_server(garbage in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async {
            let server = start(&[]).await;
            let mut client = WireClient::login(server.address, "app", "app123").await;
            for body in &garbage {
                let mut frame = (body.len() as u32).to_be_bytes().to_vec();
                frame.extend_from_slice(body);
                client.send_raw(&frame).await;
            }
            // A truncated frame: the length promises more than ever arrives.
            client.send_raw(&[0, 0, 0, 50, 0, 2]).await;
            drop(client);
            let mut healthy = WireClient::login(server.address, "app", "app123").await;
            healthy.call(create("after")).await.unwrap();
            let answer = healthy.call(produce("after", &["ok"])).await.unwrap();
            assert!(matches!(answer.body, ResponseBody::Ok(Response::Produce(_))), "{answer:?}");
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_user_revokes_its_open_sessions() {
    let server = start(&[]).await;
    let mut consumer = WireClient::login(server.address, "consumer", "consumer123").await;
    let mut admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    admin.call(create("orders")).await.unwrap();
    assert!(matches!(
        consumer.call(fetch("orders", None)).await.unwrap().body,
        ResponseBody::Ok(_)
    ));
    let delete = Request::DeleteUser(malachi_wire::messages::DeleteUserRequest {
        username: text("consumer"),
    });
    assert!(matches!(admin.call(delete).await.unwrap().body, ResponseBody::Ok(_)));
    consumer.send(fetch("orders", None)).await;
    let answer = consumer.recv(Expect::Reply(malachi_wire::ApiKey::Fetch)).await.unwrap();
    assert_eq!(
        (answer.corr, reason(&answer).as_str()),
        (0, "permission_denied"),
        "nothing is served"
    );
    assert!(consumer.is_closed().await);
}

fn create_user(username: &str, password: &str) -> Request {
    Request::CreateUser(malachi_wire::messages::CreateUserRequest {
        username: text(username),
        password: text(password),
        permissions: vec![text("consume")],
    })
}

fn change_password(username: &str, password: &str) -> Request {
    Request::ChangePassword(malachi_wire::messages::ChangePasswordRequest {
        username: text(username),
        new_password: text(password),
    })
}

/// `MALACHI_MIN_PASSWORD_LEN` (6 in these tests) holds for every new password; a short one is
/// refused `invalid_password` and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_passwords_must_meet_the_minimum_length() {
    let server = start(&[]).await;
    let mut admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    type Case = (&'static str, Request, Option<&'static str>);
    let cases: Vec<Case> = vec![
        ("create short", create_user("bob", "five5"), Some("invalid_password")),
        ("create at the minimum", create_user("bob", "six666"), None),
        ("change to short", change_password("bob", "tiny"), Some("invalid_password")),
        ("change to empty", change_password("bob", ""), Some("invalid_password")),
        ("change at the minimum", change_password("bob", "seven77"), None),
    ];
    for (name, request, refusal) in cases {
        let answer = admin.call(request).await.unwrap();
        match refusal {
            Some(expected) => assert_eq!(reason(&answer), expected, "{name}"),
            None => assert!(matches!(answer.body, ResponseBody::Ok(_)), "{name}: {answer:?}"),
        }
    }
    let mut refused = WireClient::connect(server.address).await;
    let answer = refused.call(auth("bob", "tiny")).await.unwrap();
    assert_eq!(reason(&answer), "invalid_credentials", "the refused change changed nothing");
    WireClient::login(server.address, "bob", "seven77").await;
}

fn acl(username: &str, pattern: &str, grant: bool) -> Request {
    let request =
        AclRequest { username: text(username), operation: text("consume"), pattern: text(pattern) };
    if grant { Request::GrantAcl(request) } else { Request::RevokeAcl(request) }
}

/// Under strict ACLs a subscription lives on its grant: once an admin revokes it, the next push
/// is refused `permission_denied` on the subscription's corr and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_grant_ends_an_open_subscription() {
    let server = start(&[("ACL_STRICT", "true")]).await;
    let mut admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    admin.call(create("orders")).await.unwrap();
    let granted = admin.call(acl("consumer", "orders", true)).await.unwrap();
    assert!(matches!(granted.body, ResponseBody::Ok(_)));
    let mut consumer = WireClient::login(server.address, "consumer", "consumer123").await;
    let subscribe = Request::Subscribe(SubscribeRequest {
        topic: text("orders"),
        group: None,
        member: None,
        window_records: 100,
        max_records: 10,
    });
    let corr = consumer.send(subscribe).await;
    admin.call(produce("orders", &["before"])).await.unwrap();
    let push = consumer.recv(Expect::Reply(malachi_wire::ApiKey::Subscribe)).await.unwrap();
    assert_eq!((push.corr, fetched(&push).0), (corr, 1), "pushed while granted");

    let revoked = admin.call(acl("consumer", "orders", false)).await.unwrap();
    assert!(matches!(revoked.body, ResponseBody::Ok(_)));
    admin.call(produce("orders", &["after"])).await.unwrap();
    let end = consumer.recv(Expect::Reply(malachi_wire::ApiKey::Subscribe)).await.unwrap();
    assert_eq!(
        (end.corr, reason(&end).as_str()),
        (corr, "permission_denied"),
        "the record produced after the revocation is not pushed"
    );
    assert!(consumer.is_closed().await);
}

/// The answer to a fetch on a session that no longer stands: `permission_denied` on corr 0, then
/// the connection closes.
async fn assert_session_ended(client: &mut WireClient, what: &str) {
    client.send(fetch("orders", None)).await;
    let answer = client.recv(Expect::Reply(malachi_wire::ApiKey::Fetch)).await.unwrap();
    assert_eq!((answer.corr, reason(&answer).as_str()), (0, "permission_denied"), "{what}");
    assert!(client.is_closed().await, "{what}");
}

/// A password change ends every other session of the user at its next request, whoever made
/// it; the session that changed its own password goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_change_ends_the_users_other_sessions() {
    let server = start(&[]).await;
    let mut admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    let mut other_admin = WireClient::login(server.address, "admin", "admin-password-long").await;
    let mut consumer = WireClient::login(server.address, "consumer", "consumer123").await;
    admin.call(create("orders")).await.unwrap();
    let served = consumer.call(fetch("orders", None)).await.unwrap();
    assert!(matches!(served.body, ResponseBody::Ok(_)));

    let changed = admin.call(change_password("consumer", "consumer-new")).await.unwrap();
    assert!(matches!(changed.body, ResponseBody::Ok(_)));
    assert_session_ended(&mut consumer, "changed by an admin").await;
    let mut old = WireClient::connect(server.address).await;
    let answer = old.call(auth("consumer", "consumer123")).await.unwrap();
    assert_eq!(reason(&answer), "invalid_credentials");
    WireClient::login(server.address, "consumer", "consumer-new").await;

    let changed = admin.call(change_password("admin", "admin-new-password")).await.unwrap();
    assert!(matches!(changed.body, ResponseBody::Ok(_)));
    let served = admin.call(fetch("orders", None)).await.unwrap();
    assert!(matches!(served.body, ResponseBody::Ok(_)), "its own session goes on: {served:?}");
    assert_session_ended(&mut other_admin, "the admin's other session").await;
}
