# Shared by the cluster benchmarks (scripts/bench-replication, scripts/bench-peer-tls): start
# brokers on fresh directories, run `bench wire` against them, read their CPU from /proc.
# The caller sets: bin (the malachi binary), seconds (of each load), work (a scratch directory),
# password (the admin's), and may set extra_env (an array of NAME=value for every broker).

export MALACHI_USER=admin MALACHI_PASSWORD=$password MALACHI_AUTO_SPLIT_ENABLED=false
# Every broker of the cluster knows the join token (docs/security.md, "Between brokers").
export MALACHI_CLUSTER_TOKEN=bench-cluster-token-0123456789abcdef
declare -A pid_of # broker name -> its process
extra_env=()

stop_all() {
    for pid in "${pid_of[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pid_of=()
}

# serve NAME PORT NODE_ID [JOIN]: a broker on PORT (client), PORT+1 (HTTP), PORT+2 (cluster),
# PORT+5000 (gossip), with extra_env set.
serve() {
    local name=$1 port=$2 node_id=$3 join=${4:-}
    local args=(serve --data-dir "$work/$name" --port "$port" --dashboard-port $((port + 1))
        --cluster-port $((port + 2))
        --gossip-port $((port + 5000)) --node-id "$node_id")
    [[ -n $join ]] && args+=(--join "$join")
    env MALACHI_ADMIN_PASS="$password" "${extra_env[@]}" "$bin" "${args[@]}" \
        >>"$work/$name.log" 2>&1 &
    pid_of[$name]=$!
}

# serve_cluster: brokers n1, n2, n3 on 4640, 4740, 4840, joined through n1; returns once all
# three see each other alive.
serve_cluster() {
    serve n1 4640 1
    wait_for_brokers 4640 1
    serve n2 4740 2 127.0.0.1:4642
    serve n3 4840 3 127.0.0.1:4642
    wait_for_brokers 4640 3
    sleep 2 # vnode voters added and leadership spread
}

wait_for_brokers() { # PORT COUNT
    for _ in $(seq 1 120); do
        local alive
        alive=$("$bin" cluster status --server "127.0.0.1:$1" 2>/dev/null | grep -c ' alive' || true)
        [[ $alive -ge $2 ]] && return 0
        sleep 0.5
    done
    echo "the cluster did not form: see $work/*.log" >&2
    exit 1
}

# wait_ready HTTP_PORT: until the broker answers /ready (its metadata caught up), as a rolling
# restart waits before it stops the next broker. Asked with `health_bin` (default: `bin`).
wait_ready() {
    for _ in $(seq 1 240); do
        "${health_bin:-$bin}" health --address "127.0.0.1:$1" >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    echo "the broker on HTTP port $1 never became ready: see $work/*.log" >&2
    exit 1
}

# field JSON NAME
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

wire() { # PORT TOPIC ARGS...
    local port=$1 topic=$2
    shift 2
    "$bin" bench wire --server "127.0.0.1:$port" --topic "$topic" --record-bytes 1024 \
        --seconds "${wire_seconds:-$seconds}" --json "$@"
}

# CPU seconds the brokers running now have used (user and system), from /proc.
broker_cpu_s() {
    local ticks=0 pid
    for pid in "${pid_of[@]}"; do
        ticks=$((ticks + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    python3 -c "print($ticks / $(getconf CLK_TCK))"
}

# throughput PORT TOPIC: the produce load's MB/s and the cores the brokers kept busy meanwhile.
throughput() {
    local before after figures
    before=$(broker_cpu_s)
    figures=$(wire "$1" "$2" --connections 32 --batch 100)
    after=$(broker_cpu_s)
    echo "$(field "$figures" produced_mb_per_s) $(python3 -c "print(round(($after - $before) / $seconds, 2))")"
}
latency() { wire "$1" "$2-latency" --connections 1 --batch 1; }

# The primary of the topic's active segment, from `topic describe` (the starred replica).
primary_of() { # PORT TOPIC
    "$bin" topic describe "$2" --server "127.0.0.1:$1" |
        awk '$4 == "active" { for (i = 5; i <= NF; i++) if ($i ~ /\*$/) p = $i } END { print p }' |
        tr -d '*'
}
