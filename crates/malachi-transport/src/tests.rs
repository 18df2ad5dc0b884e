use super::*;

/// Answers `echo:<payload>`, after sleeping as many milliseconds as the request's kind says, so
/// that answers can overtake each other; kind 255 fails the call.
struct Echo;

impl Handler for Echo {
    fn handle(&self, request: Request) -> HandlerFuture {
        Box::pin(async move {
            if request.kind == 255 {
                return Err("refused by the handler".to_string());
            }
            tokio::time::sleep(Duration::from_millis(u64::from(request.kind))).await;
            let mut answer =
                format!("{}:{}:", request.source_node_id, request.group_id).into_bytes();
            answer.extend_from_slice(&request.payload);
            Ok(answer)
        })
    }
}

const CLUSTER: &str = "0123456789abcdef0123456789abcdef";

async fn listening(
    node_id: u64,
    cluster_id: &str,
) -> (Transport, String, tokio::task::JoinHandle<()>) {
    let transport = Transport::new(node_id, cluster_id);
    transport.set_handler(Arc::new(Echo));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(transport.clone().serve(listener));
    (transport, address, task)
}

fn request(group_id: u64, kind: u8, payload: &[u8]) -> Request {
    Request { service: Service::Raft, group_id, kind, source_node_id: 1, payload: payload.to_vec() }
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn calls_are_multiplexed_and_answered_out_of_order() {
    let (_server, address, _task) = listening(2, CLUSTER).await;
    let client = Transport::new(1, CLUSTER);
    client.set_address(2, &address);
    // The slow call is sent first and answered last, on the same connection.
    let slow = client.call(2, request(7, 80, b"slow"), SECOND);
    let fast = client.call(2, request(8, 0, b"fast"), SECOND);
    let (slow, fast) = tokio::join!(slow, fast);
    assert_eq!(slow.unwrap(), b"1:7:slow");
    assert_eq!(fast.unwrap(), b"1:8:fast");
    assert_eq!(client.inner.links.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn failures_are_named() {
    let (_server, address, _task) = listening(2, CLUSTER).await;
    let client = Transport::new(1, CLUSTER);
    // No address for node 3.
    let error = client.call(3, request(0, 0, b""), SECOND).await.unwrap_err();
    assert!(matches!(error, CallError::Unreachable { .. }), "{error:?}");
    // The handler's own failure.
    client.set_address(2, &address);
    assert_eq!(
        client.call(2, request(0, 255, b""), SECOND).await.unwrap_err(),
        CallError::Failed("refused by the handler".into())
    );
    // Slower than the timeout.
    let error = client.call(2, request(0, 200, b""), Duration::from_millis(20)).await.unwrap_err();
    assert_eq!(error, CallError::Timeout);
    // The address book says node 4 listens where node 2 does.
    client.set_address(4, &address);
    let error = client.call(4, request(0, 0, b""), SECOND).await.unwrap_err();
    assert!(
        matches!(&error, CallError::Refused { reason, .. } if reason.contains("not node 4")),
        "{error:?}"
    );
}

#[tokio::test]
async fn brokers_of_another_cluster_are_refused_both_ways() {
    let (_server, address, _task) = listening(2, CLUSTER).await;
    let stranger = Transport::new(1, "ffffffffffffffffffffffffffffffff");
    stranger.set_address(2, &address);
    let error = stranger.call(2, request(0, 0, b""), SECOND).await.unwrap_err();
    assert!(
        matches!(&error, CallError::Refused { reason, .. } if reason.contains("belongs to cluster")),
        "{error:?}"
    );
    // A node that has not joined may call (to join), and learns the cluster from the hello.
    let joiner = Transport::new(5, "");
    let (hello, answer) =
        joiner.call_address(&address, request(0, 0, b"hi"), SECOND).await.unwrap();
    assert_eq!(hello, Hello { node_id: 2, cluster_id: CLUSTER.into() });
    assert_eq!(answer, b"1:0:hi");
    // But nobody may call it before it joined.
    let (_fresh, fresh_address, _fresh_task) = listening(6, "").await;
    let error = joiner.call_address(&fresh_address, request(0, 0, b""), SECOND).await.unwrap_err();
    assert!(
        matches!(&error, CallError::Refused { reason, .. } if reason.contains("not joined")),
        "{error:?}"
    );
}

/// A peer on a runtime of its own, which a test can kill with every task and socket it holds,
/// as a process dies.
fn peer_on_own_runtime(node_id: u64, listener: std::net::TcpListener) -> tokio::runtime::Runtime {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    runtime.spawn(async move {
        let transport = Transport::new(node_id, CLUSTER);
        transport.set_handler(Arc::new(Echo));
        transport.serve(TcpListener::from_std(listener).unwrap()).await;
    });
    runtime
}

/// Binds `address` again once the runtime shut down in the background has closed the listener
/// it held there (its worker thread drops the socket a moment after `shutdown_background`).
fn rebind(address: &str) -> std::net::TcpListener {
    for _ in 0..500 {
        match std::net::TcpListener::bind(address) {
            Ok(listener) => {
                listener.set_nonblocking(true).unwrap();
                return listener;
            }
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(error) => panic!("binding {address} again: {error}"),
        }
    }
    panic!("{address} was still taken 5 s after its listener's runtime shut down");
}

fn std_listener(address: &str) -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind(address).unwrap();
    listener.set_nonblocking(true).unwrap();
    listener
}

#[tokio::test]
async fn a_restarted_peer_is_reached_again() {
    let listener = std_listener("127.0.0.1:0");
    let address = listener.local_addr().unwrap().to_string();
    let first = peer_on_own_runtime(2, listener);
    let client = Transport::new(1, CLUSTER);
    client.set_address(2, &address);
    assert_eq!(client.call(2, request(0, 0, b"a"), SECOND).await.unwrap(), b"1:0:a");
    first.shutdown_background();
    // The dead peer's connection fails the next call (or it meets a closed link) ...
    let mut failed = 0;
    while client.call(2, request(0, 0, b"b"), SECOND).await.is_ok() {
        failed += 1;
        assert!(failed < 100, "calls to a dead peer kept succeeding");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... and once it is back on the same address, calls reconnect.
    let second = peer_on_own_runtime(2, rebind(&address));
    assert_eq!(client.call(2, request(0, 0, b"c"), SECOND).await.unwrap(), b"1:0:c");
    // The call made no second link slot: one per peer.
    assert_eq!(client.inner.links.lock().unwrap().len(), 1);
    second.shutdown_background();
}

#[tokio::test]
async fn a_dead_peer_fails_calls_fast() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let client = Transport::new(1, CLUSTER);
    client.set_address(2, &address);
    let error = client.call(2, request(0, 0, b""), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(error, CallError::Unreachable { .. }), "{error:?}");
}
