//! One source per setting (issue 34): a node file that sets every node
//! setting to a value other than its default, read and converted as
//! `wasmkeep serve` does (`NodeConfig::load`, then `check_exposure`,
//! `cluster`, `runtime` and `server`, as `run_node` calls them), and every
//! consumer field the setting is copied into holds that value. A setting
//! added to `NodeConfig` without a value here and a row below fails the
//! test (the serialized config is the list of settings), as does a copy
//! that is missing or crossed (each setting has a value of its own).
//!
//! Beside it: each consumer's own default against the node's, for the
//! settings that pass from one struct to another (the protocol the runtime
//! carries and `ClusterSettings::new` takes from it, with the fields it
//! derives); and the README's default column against `NodeConfig::default()`.
//!
//! `NodeConfig` lives in the binary, which has no library target: the test
//! compiles `src/config.rs` into itself (its unit tests then run here too).

#[allow(
    dead_code,
    reason = "the binary's config module, of which this test uses a part"
)]
#[path = "../src/config.rs"]
mod config;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::Path;

use config::NodeConfig;
use wasmkeep_runtime::RuntimeConfig;
use wasmkeep_server::ServerConfig;
use wasmkeep_server::cluster::{ClusterConfig, ClusterSettings};

/// Every setting, none at its default, each number a value of its own (so
/// that a copy from the wrong setting shows), all within what a node
/// accepts: `parked_replies_max` below `connections_max`,
/// `owner_margin_ms` below two thirds of `lease_period_ms`, a power of two
/// for `sqlite_page_bytes`, snapshot parts of at least 5 MiB, and
/// `advertise` with `bucket` (cluster mode, so that `cluster()` has
/// settings to check).
const NODE_TOML: &str = r#"
listen = "0.0.0.0:9191"
data = "settings-reach-data"
durability = "process"
commit_log = false
default_durability = "local"
admin_token = "admin-secret"
tenant_tokens = { acme = "tenant-secret" }
insecure = true
event_cpu_ms_max = 31001
instance_memory_bytes_max = 100000001
instance_keep_resident_bytes = 1048577
instances_max = 2003
open_databases_max = 777
actor_idle_ms = 61003
actor_queue_events_max = 1004
actor_queue_bytes_max = 64000005
node_queue_bytes_max = 1000000006
node_memory_bytes_max = 3000000007
request_bodies_bytes_max = 100000008
socket_buffers_bytes_max = 50000009
replica_buffers_bytes_max = 100000010
tenant_share_pct = 37
tenant_actors_max = 999011
tenant_disk_bytes_max = 5000000012
tenant_bucket_bytes_max = 20000000013
bucket_usage_interval_ms = 300014
batch_events_max = 215
batch_time_budget_ms = 16
workers = 3
workers_spare = 5
turn_slice_ms = 117
tenant_workers_max = 2
component_bytes_max = 60000018
app_versions_max = 7
component_compile_ms_max = 60019
component_compile_memory_bytes_max = 2000000020
compile_in_child = false
component_core_instances_max = 9
component_memories_max = 7
component_tables_max = 12
event_log_lines_max = 1021
event_log_bytes_max = 262022
request_body_bytes_max = 30000023
response_body_bytes_max = 30000024
value_bytes_max = 2000025
sql_bytes_max = 100026
sql_params_max = 127
key_bytes_max = 2028
database_bytes_max = 20000000029
kv_list_entries_max = 10030
query_result_bytes_max = 30000031
statement_memory_bytes_max = 60000032
statement_temp_file_bytes_max = 250000033
sqlite_page_bytes = 8192
alarm_retry_first_ms = 1034
alarm_retry_max_ms = 300035
alarm_prepare_ms = 2036
idempotency_retention_ms = 3600071
alarm_fire_batch_max = 4037
alarm_rehearse = false
list_actors_max = 1038
inspect_rows_max = 1039
connections_max = 2040
header_read_timeout_ms = 10041
idle_timeout_ms = 60042
body_read_timeout_ms = 20043
body_read_bytes_per_s_min = 16044
shutdown_drain_ms = 10045
bucket = "file:///tmp/wasmkeep-settings-reach-bucket"
replica_snapshot_every_entries = 1046
replica_snapshot_log_ratio_pct = 147
replica_snapshot_log_bytes_min = 4000048
replica_snapshots_keep = 4
replica_snapshot_part_bytes = 6000049
restore_refused_retry_ms = 60050
replica_upload_interval_ms = 1051
advertise = "http://10.0.0.7:9191"
cluster_token = "cluster-secret"
lease_period_ms = 9052
lease_grace_ms = 5053
owner_margin_ms = 1054
lease_register_retry_ms = 1055
alarm_sweep_ms = 10056
cluster_bucket_timeout_ms = 2057
cluster_forward_timeout_ms = 30058
cluster_owner_cache_ttl_ms = 2059
cluster_actors_max = 100060
cluster_deploy_sync_ms = 2071
cluster_rebalance_moves_per_s = 2093
cluster_node_id = "node-reach"
outbox_pending_max = 1061
outbox_body_bytes_max = 1000062
outbox_context_bytes_max = 65063
outbox_attempts_max = 11
outbox_retry_first_ms = 264
outbox_retry_max_ms = 60065
outbox_response_attempts_max = 14
outbox_in_flight_max = 1066
outbox_per_actor_max = 17
outbox_node_bytes_max = 250000067
outbound_timeout_ms_max = 30068
outbound_response_bytes_max = 4000069
outbound_per_actor_max = 13
outbound_per_app_max = 270
outbound_private_allowed = true
parked_reply_ms_max = 300071
parked_replies_max = 772
parked_per_actor_max = 273
parked_per_tenant_max = 274
sockets_per_actor_max = 10075
sockets_per_tenant_max = 50076
sockets_max = 100077
socket_message_bytes_max = 1000078
socket_send_buffer_bytes_max = 1000079
socket_idle_ms = 600080
sockets_per_client_max = 1081
access_log = true
trace_sample_pct = 37
otlp_endpoint = "http://127.0.0.1:4318"
failed_request_log_per_s = 82
log_buffer_lines = 10083
log_buffer_bytes = 8000084
log_followers_max = 33
metrics_classes_max = 1085
metrics_census_ms = 60086
[app_limit_ceilings]
value_bytes_max = 4000087
sql_bytes_max = 200088
sql_params_max = 189
key_bytes_max = 4090
database_bytes_max = 30000000091
kv_list_entries_max = 20092
event_cpu_ms_max = 90093
"#;

/// Settings whose consumer is no struct the conversions return but
/// `run_node` itself (main.rs), out of this test's reach; each names where
/// it is read. Listed so that a new setting is never left out unnoticed.
const READ_BY_RUN_NODE: &[(&str, &str)] = &[
    ("listen", "main.rs run_node: TcpListener::bind(cfg.listen)"),
    (
        "compile_in_child",
        "main.rs run_node: rc.compile = Compile::Process (runtime() leaves Compile::Thread)",
    ),
];

/// What each setting was checked against.
#[derive(Default)]
struct Reach {
    /// Setting, consumer, and what is wrong (`None`: it arrived).
    rows: Vec<(String, String, Option<String>)>,
}

impl Reach {
    fn check<T: PartialEq + Debug>(&mut self, setting: &str, consumer: &str, got: &T, want: &T) {
        let wrong = (got != want).then(|| format!("{consumer} is {got:?}, the setting {want:?}"));
        self.rows
            .push((setting.to_owned(), consumer.to_owned(), wrong));
    }

    /// Fails naming every setting not set in `NODE_TOML`, every setting
    /// no row checks, every row about no setting, and every consumer that
    /// does not hold its setting's value.
    fn finish(self, settings: &BTreeSet<String>, at_default: &[String]) {
        let checked: BTreeSet<&str> = self
            .rows
            .iter()
            .map(|(s, _, _)| s.as_str())
            .chain(READ_BY_RUN_NODE.iter().map(|(s, _)| *s))
            .collect();
        let unchecked: Vec<&String> = settings
            .iter()
            .filter(|s| !checked.contains(s.as_str()))
            .collect();
        let unknown: Vec<&&str> = checked.iter().filter(|s| !settings.contains(**s)).collect();
        let unreached: Vec<String> = self
            .rows
            .iter()
            .filter_map(|(s, _, wrong)| wrong.as_ref().map(|w| format!("`{s}`: {w}")))
            .collect();
        assert!(
            at_default.is_empty() && unchecked.is_empty() && unknown.is_empty(),
            "settings left at their default in NODE_TOML: {at_default:?}; settings no row \
             checks: {unchecked:?}; rows about no setting: {unknown:?}"
        );
        assert!(
            unreached.is_empty(),
            "{} settings do not reach a consumer:\n{}",
            unreached.len(),
            unreached.join("\n")
        );
    }
}

/// One row: `reach!(r, n.SETTING => CONSUMER.FIELD)` checks that the
/// consumer's field equals the node's setting.
macro_rules! reach {
    ($r:ident, $n:ident . $setting:ident => $($consumer:tt)+) => {
        $r.check(
            stringify!($setting),
            stringify!($($consumer)+),
            &$($consumer)+,
            &$n.$setting,
        )
    };
}

/// The node's settings as the serialized config names them: each
/// top-level key, and `table.key` for each key of a table whose default
/// has keys (`app_limit_ceilings`); with those of `c` at their default.
fn settings_at_default(c: &NodeConfig) -> (BTreeSet<String>, Vec<String>) {
    let defaults = serde_json::to_value(NodeConfig::default()).unwrap();
    let ours = serde_json::to_value(c).unwrap();
    let (mut all, mut same) = (BTreeSet::new(), Vec::new());
    for (key, default) in defaults.as_object().expect("the config is a table") {
        let leaves: Vec<(String, &serde_json::Value, &serde_json::Value)> =
            match default.as_object() {
                Some(table) if !table.is_empty() => table
                    .iter()
                    .map(|(sub, d)| (format!("{key}.{sub}"), d, &ours[key][sub]))
                    .collect(),
                _ => vec![(key.clone(), default, &ours[key])],
            };
        for (name, d, o) in leaves {
            if d == o {
                same.push(name.clone());
            }
            all.insert(name);
        }
    }
    (all, same)
}

fn runtime_rows(r: &mut Reach, n: &NodeConfig, runtime: &RuntimeConfig) {
    reach!(r, n.data => runtime.data_dir);
    reach!(r, n.durability => runtime.durability);
    reach!(r, n.commit_log => runtime.commit_log);
    reach!(r, n.event_cpu_ms_max => runtime.event_cpu_ms_max);
    reach!(r, n.instance_memory_bytes_max => runtime.instance_memory_bytes_max);
    reach!(r, n.instance_keep_resident_bytes => runtime.instance_keep_resident_bytes);
    reach!(r, n.instances_max => runtime.instances_max);
    reach!(r, n.open_databases_max => runtime.open_databases_max);
    reach!(r, n.actor_idle_ms => runtime.actor_idle_ms);
    reach!(r, n.actor_queue_events_max => runtime.actor_queue_events_max);
    reach!(r, n.actor_queue_bytes_max => runtime.actor_queue_bytes_max);
    reach!(r, n.node_queue_bytes_max => runtime.node_queue_bytes_max);
    reach!(r, n.node_memory_bytes_max => runtime.node_memory_bytes_max);
    reach!(r, n.request_bodies_bytes_max => runtime.request_bodies_bytes_max);
    reach!(r, n.socket_buffers_bytes_max => runtime.socket_buffers_bytes_max);
    reach!(r, n.replica_buffers_bytes_max => runtime.replica_buffers_bytes_max);
    reach!(r, n.tenant_share_pct => runtime.tenant_share_pct);
    reach!(r, n.tenant_actors_max => runtime.tenant_actors_max);
    reach!(r, n.tenant_disk_bytes_max => runtime.tenant_disk_bytes_max);
    reach!(r, n.tenant_bucket_bytes_max => runtime.tenant_bucket_bytes_max);
    reach!(r, n.bucket_usage_interval_ms => runtime.bucket_usage_interval_ms);
    reach!(r, n.batch_events_max => runtime.batch_events_max);
    reach!(r, n.batch_time_budget_ms => runtime.batch_time_budget_ms);
    reach!(r, n.workers => runtime.workers);
    reach!(r, n.workers_spare => runtime.workers_spare);
    reach!(r, n.turn_slice_ms => runtime.turn_slice_ms);
    reach!(r, n.tenant_workers_max => runtime.tenant_workers_max);
    reach!(r, n.component_bytes_max => runtime.component_bytes_max);
    reach!(r, n.app_versions_max => runtime.app_versions_max);
    reach!(r, n.component_compile_ms_max => runtime.component_compile_ms_max);
    reach!(r, n.component_compile_memory_bytes_max => runtime.component_compile_memory_bytes_max);
    reach!(r, n.component_core_instances_max => runtime.component_core_instances_max);
    reach!(r, n.component_memories_max => runtime.component_memories_max);
    reach!(r, n.component_tables_max => runtime.component_tables_max);
    reach!(r, n.event_log_lines_max => runtime.event_log_lines_max);
    reach!(r, n.event_log_bytes_max => runtime.event_log_bytes_max);
    reach!(r, n.response_body_bytes_max => runtime.response_body_bytes_max);
    reach!(r, n.alarm_retry_first_ms => runtime.protocol.retry_first_ms);
    reach!(r, n.alarm_retry_max_ms => runtime.protocol.retry_max_ms);
    reach!(r, n.lease_period_ms => runtime.protocol.lease_period_ms);
    reach!(r, n.lease_grace_ms => runtime.protocol.lease_grace_ms);
    reach!(r, n.owner_margin_ms => runtime.protocol.owner_margin_ms);
    reach!(r, n.lease_register_retry_ms => runtime.protocol.lease_register_retry_ms);
    reach!(r, n.alarm_sweep_ms => runtime.protocol.alarm_sweep_ms);
    reach!(r, n.alarm_prepare_ms => runtime.alarm_prepare_ms);
    reach!(r, n.idempotency_retention_ms => runtime.idempotency_retention_ms);
    reach!(r, n.alarm_fire_batch_max => runtime.alarm_fire_batch_max);
    reach!(r, n.alarm_rehearse => runtime.alarm_rehearse);
    reach!(r, n.restore_refused_retry_ms => runtime.restore_refused_retry_ms);
    reach!(r, n.replica_upload_interval_ms => runtime.replica_upload_interval_ms);
    reach!(r, n.metrics_classes_max => runtime.metrics_classes_max);
    reach!(r, n.metrics_census_ms => runtime.metrics_census_ms);
    // Cluster mode is `advertise` with `bucket` (the bucket itself is
    // opened by run_node: `rc.bucket = Bucket::from_url(..)`).
    r.check("bucket", "runtime.cluster", &runtime.cluster, &true);
    r.check("advertise", "runtime.cluster", &runtime.cluster, &true);

    reach!(r, n.value_bytes_max => runtime.store.value_bytes_max);
    reach!(r, n.sql_bytes_max => runtime.store.sql_bytes_max);
    reach!(r, n.sql_params_max => runtime.store.sql_params_max);
    reach!(r, n.key_bytes_max => runtime.store.key_bytes_max);
    reach!(r, n.database_bytes_max => runtime.store.database_bytes_max);
    reach!(r, n.kv_list_entries_max => runtime.store.kv_list_entries_max);
    reach!(r, n.query_result_bytes_max => runtime.store.query_result_bytes_max);
    reach!(r, n.statement_memory_bytes_max => runtime.store.statement_memory_bytes_max);
    reach!(r, n.statement_temp_file_bytes_max => runtime.store.statement_temp_file_bytes_max);
    reach!(r, n.sqlite_page_bytes => runtime.store.page_bytes);

    // What a replica reads from the bucket is bounded by what one snapshot
    // of the largest database allowed takes.
    r.check(
        "database_bytes_max",
        "runtime.replica.entry_bytes_max",
        &runtime.replica.entry_bytes_max,
        &wasmkeep_replica::ReplicaConfig::entry_bytes_max_for(n.database_bytes_max),
    );
    reach!(r, n.replica_snapshot_every_entries => runtime.replica.snapshot_every_entries);
    reach!(r, n.replica_snapshot_log_ratio_pct => runtime.replica.snapshot_log_ratio_pct);
    reach!(r, n.replica_snapshot_log_bytes_min => runtime.replica.snapshot_log_bytes_min);
    reach!(r, n.replica_snapshots_keep => runtime.replica.snapshots_keep);
    reach!(r, n.replica_snapshot_part_bytes => runtime.replica.snapshot_part_bytes);

    reach!(r, n.outbox_pending_max => runtime.outbox.pending_max);
    reach!(r, n.outbox_body_bytes_max => runtime.outbox.body_bytes_max);
    reach!(r, n.outbox_context_bytes_max => runtime.outbox.context_bytes_max);
    reach!(r, n.outbox_attempts_max => runtime.outbox.attempts_max);
    reach!(r, n.outbox_retry_first_ms => runtime.outbox.retry_first_ms);
    reach!(r, n.outbox_retry_max_ms => runtime.outbox.retry_max_ms);
    reach!(r, n.outbox_response_attempts_max => runtime.outbox.response_attempts_max);
    reach!(r, n.outbox_in_flight_max => runtime.outbox.in_flight_max);
    reach!(r, n.outbox_per_actor_max => runtime.outbox.per_actor_max);
    reach!(r, n.outbox_node_bytes_max => runtime.outbox.node_bytes_max);
    reach!(r, n.outbound_timeout_ms_max => runtime.outbound.timeout_ms_max);
    reach!(r, n.outbound_response_bytes_max => runtime.outbound.response_bytes_max);
    reach!(r, n.outbound_per_actor_max => runtime.outbound.per_actor_max);
    reach!(r, n.outbound_per_app_max => runtime.outbound.per_app_max);
    reach!(r, n.outbound_private_allowed => runtime.outbound.private_allowed);
    reach!(r, n.parked_reply_ms_max => runtime.parked.reply_ms_max);
    reach!(r, n.parked_replies_max => runtime.parked.node_max);
    reach!(r, n.parked_per_actor_max => runtime.parked.per_actor_max);
    reach!(r, n.parked_per_tenant_max => runtime.parked.per_tenant_max);
    reach!(r, n.sockets_per_actor_max => runtime.sockets.per_actor_max);
    reach!(r, n.sockets_per_tenant_max => runtime.sockets.per_tenant_max);
    reach!(r, n.sockets_max => runtime.sockets.node_max);
    reach!(r, n.socket_message_bytes_max => runtime.sockets.message_bytes_max);
    reach!(r, n.socket_send_buffer_bytes_max => runtime.sockets.send_buffer_bytes_max);
    reach!(r, n.socket_idle_ms => runtime.sockets.idle_ms);
    reach!(r, n.log_buffer_lines => runtime.logs.lines_max);
    reach!(r, n.log_buffer_bytes => runtime.logs.bytes_max);
    reach!(r, n.log_followers_max => runtime.logs.followers_max);

    // A table: one row per key of `[app_limit_ceilings]`.
    macro_rules! ceilings {
        ($($key:ident),+) => {$(
            r.check(
                concat!("app_limit_ceilings.", stringify!($key)),
                concat!("runtime.app_limit_ceilings.", stringify!($key)),
                &runtime.app_limit_ceilings.$key,
                &n.app_limit_ceilings.$key,
            );
        )+};
    }
    ceilings!(
        value_bytes_max,
        sql_bytes_max,
        sql_params_max,
        key_bytes_max,
        database_bytes_max,
        kv_list_entries_max,
        event_cpu_ms_max
    );
}

fn server_rows(r: &mut Reach, n: &NodeConfig, server: &ServerConfig) {
    reach!(r, n.admin_token => server.admin_token);
    reach!(r, n.tenant_tokens => server.tenant_tokens);
    reach!(r, n.request_body_bytes_max => server.request_body_bytes_max);
    reach!(r, n.list_actors_max => server.list_actors_max);
    reach!(r, n.inspect_rows_max => server.inspect_rows_max);
    reach!(r, n.connections_max => server.connections_max);
    reach!(r, n.header_read_timeout_ms => server.header_read_timeout_ms);
    reach!(r, n.idle_timeout_ms => server.idle_timeout_ms);
    reach!(r, n.body_read_timeout_ms => server.body_read_timeout_ms);
    reach!(r, n.body_read_bytes_per_s_min => server.body_read_bytes_per_s_min);
    reach!(r, n.shutdown_drain_ms => server.shutdown_drain_ms);
    reach!(r, n.access_log => server.access_log);
    reach!(r, n.trace_sample_pct => server.trace_sample_pct);
    reach!(r, n.otlp_endpoint => server.otlp_endpoint);
    reach!(r, n.failed_request_log_per_s => server.failed_request_log_per_s);
    reach!(r, n.sockets_per_client_max => server.sockets_per_client_max);
    // `local` overrides what `advertise` alone gives a cluster node.
    let unset = NodeConfig {
        default_durability: None,
        ..n.clone()
    };
    r.check(
        "default_durability",
        "server.replicated_by_default (set, then unset)",
        &(
            server.replicated_by_default,
            unset.server().replicated_by_default,
        ),
        &(false, true),
    );
}

fn cluster_rows(r: &mut Reach, n: &NodeConfig, cluster: &ClusterSettings) {
    r.check(
        "advertise",
        "cluster.advertise",
        &Some(cluster.advertise.clone()),
        &n.advertise,
    );
    reach!(r, n.cluster_token => cluster.cluster_token);
    reach!(r, n.lease_period_ms => cluster.protocol.lease_period_ms);
    reach!(r, n.lease_grace_ms => cluster.protocol.lease_grace_ms);
    reach!(r, n.owner_margin_ms => cluster.protocol.owner_margin_ms);
    reach!(r, n.lease_register_retry_ms => cluster.protocol.lease_register_retry_ms);
    reach!(r, n.alarm_sweep_ms => cluster.protocol.alarm_sweep_ms);
    reach!(r, n.alarm_retry_first_ms => cluster.protocol.retry_first_ms);
    reach!(r, n.alarm_retry_max_ms => cluster.protocol.retry_max_ms);
    reach!(r, n.cluster_bucket_timeout_ms => cluster.bucket_timeout_ms);
    reach!(r, n.cluster_forward_timeout_ms => cluster.forward_timeout_ms);
    reach!(r, n.cluster_owner_cache_ttl_ms => cluster.owner_cache_ttl_ms);
    reach!(r, n.cluster_actors_max => cluster.actors_max);
    reach!(r, n.cluster_deploy_sync_ms => cluster.deploy_sync_ms);
    reach!(r, n.cluster_rebalance_moves_per_s => cluster.rebalance_moves_per_s);
    reach!(r, n.cluster_node_id => cluster.node_id);
    // Derived: a hold outlives the runtime's idle close, and a relayed
    // answer is what the owner's actor may send plus an error body.
    r.check(
        "actor_idle_ms",
        "cluster.release_idle_ms",
        &cluster.release_idle_ms,
        &(n.actor_idle_ms + wasmkeep_server::cluster::RELEASE_AFTER_IDLE_CLOSE_MS),
    );
    r.check(
        "response_body_bytes_max",
        "cluster.forward_response_bytes_max",
        &cluster.forward_response_bytes_max,
        &(n.response_body_bytes_max + wasmkeep_server::cluster::FORWARD_ERROR_BODY_BYTES_MAX),
    );
}

#[test]
fn every_node_setting_reaches_each_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.toml");
    std::fs::write(&file, NODE_TOML).unwrap();
    // As `wasmkeep serve --config FILE` reads it and `run_node` converts it.
    let n = NodeConfig::load(&file).expect("the node file parses");
    n.check_exposure()
        .expect("a node starts with these settings");
    let cluster = n
        .cluster()
        .unwrap()
        .expect("advertise with bucket: cluster mode");
    let runtime = n.runtime();
    let server = n.server();

    let mut r = Reach::default();
    runtime_rows(&mut r, &n, &runtime);
    server_rows(&mut r, &n, &server);
    cluster_rows(&mut r, &n, &cluster);
    // `insecure` is read by the exposure check only: off loopback without
    // a token, a node starts with it and refuses without it.
    let open = NodeConfig {
        admin_token: None,
        tenant_tokens: BTreeMap::new(),
        ..n.clone()
    };
    let closed = NodeConfig {
        insecure: false,
        ..open.clone()
    };
    r.check(
        "insecure",
        "check_exposure() off loopback without a token (set, then unset)",
        &(
            open.check_exposure().is_ok(),
            closed.check_exposure().is_ok(),
        ),
        &(true, false),
    );

    let (settings, at_default) = settings_at_default(&n);
    r.finish(&settings, &at_default);
}

/// The settings two structs hold, or one struct derives from another's,
/// have one default: each consumer's own default (what tests and
/// embedders get without a node) is the node's.
#[test]
fn each_consumers_own_default_is_the_nodes() {
    let node = NodeConfig {
        advertise: Some("http://127.0.0.1:8080".into()),
        bucket: Some("file:///tmp/wasmkeep-settings-reach-bucket".into()),
        ..NodeConfig::default()
    };
    let from_node = node.cluster().unwrap().expect("cluster mode");
    let runtime = RuntimeConfig::new("x");
    let bare = ClusterSettings::new("http://127.0.0.1:8080", None, &runtime);

    let mut r = Reach::default();
    r.check(
        "(every ClusterConfig field)",
        "ClusterConfig::default(), as RuntimeConfig::new carries it, against the node's",
        &runtime.protocol,
        &ClusterConfig::default(),
    );
    r.check(
        "(every ClusterConfig field)",
        "ClusterSettings::new(.., &RuntimeConfig::new(..)).protocol against the node's",
        &bare.protocol,
        &from_node.protocol,
    );
    let fields = [
        (
            "cluster_bucket_timeout_ms",
            "bucket_timeout_ms",
            bare.bucket_timeout_ms,
            from_node.bucket_timeout_ms,
        ),
        (
            "cluster_forward_timeout_ms",
            "forward_timeout_ms",
            bare.forward_timeout_ms,
            from_node.forward_timeout_ms,
        ),
        (
            "cluster_owner_cache_ttl_ms",
            "owner_cache_ttl_ms",
            bare.owner_cache_ttl_ms,
            from_node.owner_cache_ttl_ms,
        ),
        (
            "cluster_actors_max",
            "actors_max",
            bare.actors_max as u64,
            from_node.actors_max as u64,
        ),
        (
            "cluster_deploy_sync_ms",
            "deploy_sync_ms",
            bare.deploy_sync_ms,
            from_node.deploy_sync_ms,
        ),
        (
            "cluster_rebalance_moves_per_s",
            "rebalance_moves_per_s",
            u64::from(bare.rebalance_moves_per_s),
            u64::from(from_node.rebalance_moves_per_s),
        ),
        (
            "actor_idle_ms",
            "release_idle_ms",
            bare.release_idle_ms,
            from_node.release_idle_ms,
        ),
        (
            "response_body_bytes_max",
            "forward_response_bytes_max",
            bare.forward_response_bytes_max as u64,
            from_node.forward_response_bytes_max as u64,
        ),
    ];
    for (setting, field, got, want) in fields {
        let consumer = format!("ClusterSettings::new(..).{field} against the node's");
        r.check(setting, &consumer, &got, &want);
    }
    let wrong: Vec<String> = r
        .rows
        .into_iter()
        .filter_map(|(s, _, w)| w.map(|w| format!("`{s}`: {w}")))
        .collect();
    assert!(
        wrong.is_empty(),
        "defaults spelled twice disagree:\n{}",
        wrong.join("\n")
    );
}

/// The README's default column gives each default the code has as a
/// literal (`30000`, `"fsync"`, `true`, maybe followed by ` (64 MiB)`);
/// defaults it describes in words (unset options, tables, a share of the
/// machine's memory) are left out.
#[test]
fn the_readmes_defaults_are_the_codes() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("read README.md");
    let defaults = serde_json::to_value(NodeConfig::default()).unwrap();
    let defaults = defaults.as_object().expect("the config is a table");
    let (mut compared, mut wrong) = (0, Vec::new());
    for line in readme.lines() {
        let mut cells = line.split('|').skip(1).map(str::trim);
        let (Some(key), Some(cell)) = (cells.next(), cells.next()) else {
            continue;
        };
        let Some((key, value)) = key
            .strip_prefix('`')
            .and_then(|k| k.strip_suffix('`'))
            .and_then(|k| defaults.get_key_value(k))
        else {
            continue;
        };
        let Some((literal, rest)) = cell.strip_prefix('`').and_then(|c| c.split_once('`')) else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with(" (")) {
            continue;
        }
        let code = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(_) | serde_json::Value::Bool(_) => value.to_string(),
            _ => continue,
        };
        compared += 1;
        if literal.trim_matches('"') != code {
            wrong.push(format!(
                "`{key}`: the README says `{literal}`, the code {code}"
            ));
        }
    }
    assert!(
        compared >= 90,
        "only {compared} defaults found in the README's configuration table"
    );
    assert!(
        wrong.is_empty(),
        "the README's configuration table gives other defaults than the code:\n{}",
        wrong.join("\n")
    );
}

/// `wasmkeep serve --help` names the defaults of the settings it has a
/// flag for (`--data`, `--listen`, `--durability`) as the code has them:
/// the help is the one place besides the README that spells them.
#[test]
fn the_serve_helps_defaults_are_the_codes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["serve", "--help"])
        .output()
        .expect("run wasmkeep serve --help");
    assert!(out.status.success(), "serve --help failed");
    let help = String::from_utf8(out.stdout).expect("help is UTF-8");
    // clap wraps the help; compare it as one line.
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let defaults = serde_json::to_value(NodeConfig::default()).unwrap();
    for (flag, key) in [
        ("--data", "data"),
        ("--listen", "listen"),
        ("--durability", "durability"),
    ] {
        let value = defaults[key].as_str().expect("a string setting");
        let shown = value.strip_prefix("./").unwrap_or(value);
        let after_flag = help
            .split_once(&format!("{flag} <"))
            .map(|(_, rest)| rest)
            .unwrap_or_else(|| panic!("serve --help has no {flag}"));
        let text = after_flag.split(" --").next().unwrap_or_default();
        assert!(
            text.contains(&format!("[default: {shown}"))
                || text.contains(&format!("[default: ./{shown}")),
            "serve --help says for {flag}: {text}\nthe code's default is {value}"
        );
    }
}
