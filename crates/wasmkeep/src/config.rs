//! A node's configuration: a TOML file, then flags on top.
//!
//! Every field is documented in the README's configuration table; a test
//! (`every_config_field_is_documented`) keeps the two in step.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use wasmkeep_runtime::{AppLimits, Durability, RuntimeConfig, StoreLimits};
use wasmkeep_server::ServerConfig;

/// Everything `wasmkeep serve` can be told. Field names are the TOML keys.
/// When a reply leaves, by default: `default_durability`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ReplyDurability {
    /// After the local commit (and its fsync, with `durability = "fsync"`).
    Local,
    /// Once the bucket holds the commit.
    Replicated,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct NodeConfig {
    pub listen: SocketAddr,
    pub data: PathBuf,
    pub durability: Durability,
    /// With `durability = "fsync"`, commits are made durable through the
    /// node's commit log (ADR 0074); `false` syncs the actors' files
    /// instead (ADR 0004).
    pub commit_log: bool,
    /// How a request that names no durability is answered: `local` (after
    /// the local commit) or `replicated` (once the bucket holds it). Unset:
    /// `replicated` on a cluster node (`advertise`), `local` otherwise
    /// (ADR 0034).
    pub default_durability: Option<ReplyDurability>,
    pub admin_token: Option<String>,
    pub tenant_tokens: BTreeMap<String, String>,
    pub insecure: bool,
    pub event_cpu_ms_max: u64,
    pub instance_memory_bytes_max: usize,
    pub instance_keep_resident_bytes: usize,
    pub instances_max: u32,
    pub open_databases_max: u32,
    pub actor_idle_ms: u64,
    pub actor_queue_events_max: usize,
    pub actor_queue_bytes_max: u64,
    pub node_queue_bytes_max: u64,
    pub node_memory_bytes_max: u64,
    pub request_bodies_bytes_max: Option<u64>,
    pub socket_buffers_bytes_max: Option<u64>,
    pub replica_buffers_bytes_max: Option<u64>,
    pub tenant_share_pct: u8,
    pub tenant_actors_max: u64,
    pub tenant_disk_bytes_max: Option<u64>,
    pub tenant_bucket_bytes_max: Option<u64>,
    pub bucket_usage_interval_ms: u64,
    pub batch_events_max: usize,
    pub batch_time_budget_ms: u64,
    pub workers: usize,
    pub workers_spare: Option<usize>,
    pub turn_slice_ms: u64,
    pub tenant_workers_max: Option<usize>,
    pub component_bytes_max: usize,
    pub app_versions_max: usize,
    pub component_compile_ms_max: u64,
    pub component_compile_memory_bytes_max: u64,
    /// Compile in a child process (bounded memory, stopped at its
    /// deadline); false compiles on a thread of the node, for trusted
    /// components only.
    pub compile_in_child: bool,
    pub component_core_instances_max: u32,
    pub component_memories_max: u32,
    pub component_tables_max: u32,
    pub event_log_lines_max: u32,
    pub event_log_bytes_max: usize,
    pub request_body_bytes_max: usize,
    pub response_body_bytes_max: usize,
    pub value_bytes_max: usize,
    pub sql_bytes_max: usize,
    pub sql_params_max: usize,
    pub key_bytes_max: usize,
    pub database_bytes_max: u64,
    pub kv_list_entries_max: u32,
    pub query_result_bytes_max: usize,
    pub statement_memory_bytes_max: usize,
    pub statement_temp_file_bytes_max: u64,
    pub sqlite_page_bytes: u32,
    pub alarm_retry_first_ms: u64,
    pub alarm_retry_max_ms: u64,
    pub alarm_prepare_ms: u64,
    pub idempotency_retention_ms: u64,
    pub alarm_fire_batch_max: usize,
    pub alarm_rehearse: bool,
    pub list_actors_max: usize,
    pub inspect_rows_max: usize,
    pub connections_max: usize,
    pub header_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub body_read_timeout_ms: u64,
    pub body_read_bytes_per_s_min: u64,
    pub shutdown_drain_ms: u64,
    pub bucket: Option<String>,
    pub replica_snapshot_every_entries: u64,
    pub replica_snapshot_log_ratio_pct: u64,
    pub replica_snapshot_log_bytes_min: u64,
    pub replica_snapshots_keep: usize,
    pub replica_snapshot_part_bytes: usize,
    pub restore_refused_retry_ms: u64,
    pub replica_upload_interval_ms: u64,
    /// Cluster mode (with `bucket`): the address other nodes reach this
    /// node at, `http://HOST:PORT`.
    pub advertise: Option<String>,
    pub cluster_node_id: Option<String>,
    /// The secret cluster nodes share (`WASMKEEP_CLUSTER_TOKEN`).
    pub cluster_token: Option<String>,
    pub lease_period_ms: u64,
    pub lease_grace_ms: u64,
    pub owner_margin_ms: u64,
    pub lease_register_retry_ms: u64,
    /// How often a cluster node sweeps the alarm index (ADR 0009).
    pub alarm_sweep_ms: u64,
    pub cluster_bucket_timeout_ms: u64,
    pub cluster_forward_timeout_ms: u64,
    pub cluster_owner_cache_ttl_ms: u64,
    pub cluster_actors_max: usize,
    /// How often a cluster node installs the apps' newest versions from
    /// the bucket (ADR 0058).
    pub cluster_deploy_sync_ms: u64,
    /// Planned rebalancing's pace: actors a second a node hands to one that
    /// asks for its fair share (ADR 0072; 0: no rebalancing).
    pub cluster_rebalance_moves_per_s: u32,
    /// The outbox's bounds and outbound HTTP's ceilings (ADR 0040).
    pub outbox_pending_max: u64,
    pub outbox_body_bytes_max: usize,
    pub outbox_context_bytes_max: usize,
    pub outbox_attempts_max: u32,
    pub outbox_retry_first_ms: u64,
    pub outbox_retry_max_ms: u64,
    pub outbox_response_attempts_max: u32,
    pub outbox_in_flight_max: usize,
    pub outbox_per_actor_max: usize,
    pub outbox_node_bytes_max: u64,
    pub outbound_timeout_ms_max: u64,
    pub outbound_response_bytes_max: usize,
    pub outbound_per_actor_max: usize,
    pub outbound_per_app_max: usize,
    pub outbound_private_allowed: bool,
    /// Parked replies' bounds (ADR 0042).
    pub parked_reply_ms_max: u64,
    pub parked_replies_max: usize,
    pub parked_per_actor_max: usize,
    pub parked_per_tenant_max: usize,
    /// WebSockets' bounds (ADR 0043).
    pub sockets_per_actor_max: usize,
    pub sockets_per_tenant_max: usize,
    pub sockets_max: usize,
    pub socket_message_bytes_max: usize,
    pub socket_send_buffer_bytes_max: usize,
    pub socket_idle_ms: u64,
    pub sockets_per_client_max: usize,
    /// One line per actor request in the node's log (`wasmkeep::access`).
    pub access_log: bool,
    /// Traces (ADR 0064): the share of requests without a `traceparent`
    /// that start one, and where spans are exported.
    pub trace_sample_pct: u8,
    pub otlp_endpoint: Option<String>,
    pub failed_request_log_per_s: u64,
    /// The recent lines `wasmkeep logs` can read (issue 22).
    pub log_buffer_lines: usize,
    pub log_buffer_bytes: usize,
    pub log_followers_max: usize,
    /// Label sets of `wasmkeep_class_*` in `/metrics`, and how often the
    /// data folder is walked for their disk sizes.
    pub metrics_classes_max: usize,
    pub metrics_census_ms: u64,
    /// A table (`[app_limit_ceilings]`), so last: the highest value an
    /// app's manifest may give each of its `[limits]`.
    pub app_limit_ceilings: AppLimits,
}

impl Default for NodeConfig {
    #[allow(
        clippy::too_many_lines,
        reason = "one struct literal of every node setting, one line each: Rust wants every field in it, and each default is read from its consumer here, once"
    )]
    fn default() -> Self {
        let rt = RuntimeConfig::new("wasmkeep-data");
        let server = ServerConfig::default();
        let s = StoreLimits::default();
        let cl = &rt.protocol;
        NodeConfig {
            listen: "127.0.0.1:8080".parse().expect("valid address"),
            data: rt.data_dir.clone(),
            default_durability: None,
            durability: rt.durability,
            commit_log: rt.commit_log,
            admin_token: None,
            tenant_tokens: BTreeMap::new(),
            insecure: false,
            event_cpu_ms_max: rt.event_cpu_ms_max,
            instance_memory_bytes_max: rt.instance_memory_bytes_max,
            instance_keep_resident_bytes: rt.instance_keep_resident_bytes,
            instances_max: rt.instances_max,
            open_databases_max: rt.open_databases_max,
            actor_idle_ms: rt.actor_idle_ms,
            actor_queue_events_max: rt.actor_queue_events_max,
            actor_queue_bytes_max: rt.actor_queue_bytes_max,
            node_queue_bytes_max: rt.node_queue_bytes_max,
            node_memory_bytes_max: rt.node_memory_bytes_max,
            request_bodies_bytes_max: rt.request_bodies_bytes_max,
            socket_buffers_bytes_max: rt.socket_buffers_bytes_max,
            replica_buffers_bytes_max: rt.replica_buffers_bytes_max,
            tenant_share_pct: rt.tenant_share_pct,
            tenant_actors_max: rt.tenant_actors_max,
            tenant_disk_bytes_max: rt.tenant_disk_bytes_max,
            tenant_bucket_bytes_max: rt.tenant_bucket_bytes_max,
            bucket_usage_interval_ms: rt.bucket_usage_interval_ms,
            batch_events_max: rt.batch_events_max,
            batch_time_budget_ms: rt.batch_time_budget_ms,
            workers: rt.workers,
            workers_spare: rt.workers_spare,
            turn_slice_ms: rt.turn_slice_ms,
            tenant_workers_max: rt.tenant_workers_max,
            component_bytes_max: rt.component_bytes_max,
            app_versions_max: rt.app_versions_max,
            component_compile_ms_max: rt.component_compile_ms_max,
            component_compile_memory_bytes_max: rt.component_compile_memory_bytes_max,
            compile_in_child: true,
            component_core_instances_max: rt.component_core_instances_max,
            component_memories_max: rt.component_memories_max,
            component_tables_max: rt.component_tables_max,
            event_log_lines_max: rt.event_log_lines_max,
            event_log_bytes_max: rt.event_log_bytes_max,
            request_body_bytes_max: server.request_body_bytes_max,
            response_body_bytes_max: rt.response_body_bytes_max,
            value_bytes_max: s.value_bytes_max,
            sql_bytes_max: s.sql_bytes_max,
            sql_params_max: s.sql_params_max,
            key_bytes_max: s.key_bytes_max,
            database_bytes_max: s.database_bytes_max,
            kv_list_entries_max: s.kv_list_entries_max,
            query_result_bytes_max: s.query_result_bytes_max,
            statement_memory_bytes_max: s.statement_memory_bytes_max,
            statement_temp_file_bytes_max: s.statement_temp_file_bytes_max,
            sqlite_page_bytes: s.page_bytes,
            alarm_retry_first_ms: rt.protocol.retry_first_ms,
            alarm_retry_max_ms: rt.protocol.retry_max_ms,
            alarm_prepare_ms: rt.alarm_prepare_ms,
            idempotency_retention_ms: rt.idempotency_retention_ms,
            alarm_fire_batch_max: rt.alarm_fire_batch_max,
            alarm_rehearse: rt.alarm_rehearse,
            list_actors_max: server.list_actors_max,
            inspect_rows_max: server.inspect_rows_max,
            connections_max: server.connections_max,
            header_read_timeout_ms: server.header_read_timeout_ms,
            idle_timeout_ms: server.idle_timeout_ms,
            body_read_timeout_ms: server.body_read_timeout_ms,
            body_read_bytes_per_s_min: server.body_read_bytes_per_s_min,
            shutdown_drain_ms: server.shutdown_drain_ms,
            bucket: None,
            replica_snapshot_every_entries: rt.replica.snapshot_every_entries,
            replica_snapshot_log_ratio_pct: rt.replica.snapshot_log_ratio_pct,
            replica_snapshot_log_bytes_min: rt.replica.snapshot_log_bytes_min,
            replica_snapshots_keep: rt.replica.snapshots_keep,
            replica_snapshot_part_bytes: rt.replica.snapshot_part_bytes,
            restore_refused_retry_ms: rt.restore_refused_retry_ms,
            replica_upload_interval_ms: rt.replica_upload_interval_ms,
            advertise: None,
            cluster_node_id: None,
            cluster_token: None,
            lease_period_ms: cl.lease_period_ms,
            lease_grace_ms: cl.lease_grace_ms,
            owner_margin_ms: cl.owner_margin_ms,
            lease_register_retry_ms: cl.lease_register_retry_ms,
            alarm_sweep_ms: cl.alarm_sweep_ms,
            cluster_bucket_timeout_ms: wasmkeep_server::cluster::BUCKET_TIMEOUT_MS,
            cluster_forward_timeout_ms: wasmkeep_server::cluster::FORWARD_TIMEOUT_MS,
            cluster_owner_cache_ttl_ms: wasmkeep_server::cluster::OWNER_CACHE_TTL_MS,
            cluster_actors_max: wasmkeep_server::cluster::ACTORS_MAX,
            cluster_deploy_sync_ms: wasmkeep_server::cluster::deploys::DEPLOY_SYNC_MS,
            cluster_rebalance_moves_per_s: wasmkeep_server::cluster::rebalance::MOVES_PER_S,
            outbox_pending_max: rt.outbox.pending_max,
            outbox_body_bytes_max: rt.outbox.body_bytes_max,
            outbox_context_bytes_max: rt.outbox.context_bytes_max,
            outbox_attempts_max: rt.outbox.attempts_max,
            outbox_retry_first_ms: rt.outbox.retry_first_ms,
            outbox_retry_max_ms: rt.outbox.retry_max_ms,
            outbox_response_attempts_max: rt.outbox.response_attempts_max,
            outbox_in_flight_max: rt.outbox.in_flight_max,
            outbox_per_actor_max: rt.outbox.per_actor_max,
            outbox_node_bytes_max: rt.outbox.node_bytes_max,
            outbound_timeout_ms_max: rt.outbound.timeout_ms_max,
            outbound_response_bytes_max: rt.outbound.response_bytes_max,
            outbound_per_actor_max: rt.outbound.per_actor_max,
            outbound_per_app_max: rt.outbound.per_app_max,
            outbound_private_allowed: rt.outbound.private_allowed,
            parked_reply_ms_max: rt.parked.reply_ms_max,
            parked_replies_max: rt.parked.node_max,
            parked_per_actor_max: rt.parked.per_actor_max,
            parked_per_tenant_max: rt.parked.per_tenant_max,
            sockets_per_actor_max: rt.sockets.per_actor_max,
            sockets_per_tenant_max: rt.sockets.per_tenant_max,
            sockets_max: rt.sockets.node_max,
            socket_message_bytes_max: rt.sockets.message_bytes_max,
            socket_send_buffer_bytes_max: rt.sockets.send_buffer_bytes_max,
            socket_idle_ms: rt.sockets.idle_ms,
            sockets_per_client_max: server.sockets_per_client_max,
            access_log: server.access_log,
            trace_sample_pct: server.trace_sample_pct,
            otlp_endpoint: server.otlp_endpoint.clone(),
            failed_request_log_per_s: server.failed_request_log_per_s,
            log_buffer_lines: rt.logs.lines_max,
            log_buffer_bytes: rt.logs.bytes_max,
            log_followers_max: rt.logs.followers_max,
            metrics_classes_max: rt.metrics_classes_max,
            metrics_census_ms: rt.metrics_census_ms,
            app_limit_ceilings: rt.app_limit_ceilings.clone(),
        }
    }
}

impl NodeConfig {
    pub(crate) fn load(path: &std::path::Path) -> anyhow::Result<NodeConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("read config {}: {e}", path.display()))?;
        let c: NodeConfig =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        c.check_settings()
            .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        Ok(c)
    }

    /// Refuses settings no node can run with.
    pub(crate) fn check_settings(&self) -> anyhow::Result<()> {
        wasmkeep_store::limits::check_page_bytes("sqlite_page_bytes", self.sqlite_page_bytes)
            .map_err(|e| anyhow::anyhow!(e))?;
        // Each parked reply holds its request's connection: as many as the
        // connections would leave none for anyone else (issue 33).
        if self.parked_replies_max >= self.connections_max {
            anyhow::bail!(
                "parked_replies_max={} must be below connections_max={}: each parked reply \
                 holds a connection",
                self.parked_replies_max,
                self.connections_max
            );
        }
        if !(1..=100).contains(&self.tenant_share_pct) {
            anyhow::bail!(
                "tenant_share_pct must be from 1 to 100, not {}",
                self.tenant_share_pct
            );
        }
        Ok(())
    }

    /// The cluster protocol's settings (lease timings, the sweep, the alarm
    /// backoff): the runtime carries them, and a cluster node's settings
    /// take them from the runtime's.
    fn protocol(&self) -> wasmkeep_server::cluster::ClusterConfig {
        wasmkeep_server::cluster::ClusterConfig {
            lease_period_ms: self.lease_period_ms,
            lease_grace_ms: self.lease_grace_ms,
            owner_margin_ms: self.owner_margin_ms,
            lease_register_retry_ms: self.lease_register_retry_ms,
            alarm_sweep_ms: self.alarm_sweep_ms,
            retry_first_ms: self.alarm_retry_first_ms,
            retry_max_ms: self.alarm_retry_max_ms,
            ..wasmkeep_server::cluster::ClusterConfig::default()
        }
    }

    pub(crate) fn runtime(&self) -> RuntimeConfig {
        let mut c = RuntimeConfig::new(&self.data);
        c.durability = self.durability;
        c.commit_log = self.commit_log;
        c.event_cpu_ms_max = self.event_cpu_ms_max;
        c.instance_memory_bytes_max = self.instance_memory_bytes_max;
        c.instance_keep_resident_bytes = self.instance_keep_resident_bytes;
        c.instances_max = self.instances_max;
        c.open_databases_max = self.open_databases_max;
        c.actor_idle_ms = self.actor_idle_ms;
        c.actor_queue_events_max = self.actor_queue_events_max;
        c.actor_queue_bytes_max = self.actor_queue_bytes_max;
        c.node_queue_bytes_max = self.node_queue_bytes_max;
        c.node_memory_bytes_max = self.node_memory_bytes_max;
        c.request_bodies_bytes_max = self.request_bodies_bytes_max;
        c.socket_buffers_bytes_max = self.socket_buffers_bytes_max;
        c.replica_buffers_bytes_max = self.replica_buffers_bytes_max;
        c.tenant_share_pct = self.tenant_share_pct;
        c.tenant_actors_max = self.tenant_actors_max;
        c.tenant_disk_bytes_max = self.tenant_disk_bytes_max;
        c.tenant_bucket_bytes_max = self.tenant_bucket_bytes_max;
        c.bucket_usage_interval_ms = self.bucket_usage_interval_ms;
        c.batch_events_max = self.batch_events_max.max(1);
        c.batch_time_budget_ms = self.batch_time_budget_ms;
        c.workers = self.workers;
        c.workers_spare = self.workers_spare;
        c.turn_slice_ms = self.turn_slice_ms;
        c.tenant_workers_max = self.tenant_workers_max;
        c.component_bytes_max = self.component_bytes_max;
        c.app_versions_max = self.app_versions_max;
        c.component_compile_ms_max = self.component_compile_ms_max;
        c.component_compile_memory_bytes_max = self.component_compile_memory_bytes_max;
        c.component_core_instances_max = self.component_core_instances_max;
        c.component_memories_max = self.component_memories_max;
        c.component_tables_max = self.component_tables_max;
        c.event_log_lines_max = self.event_log_lines_max;
        c.event_log_bytes_max = self.event_log_bytes_max;
        c.app_limit_ceilings = self.app_limit_ceilings.clone();
        c.response_body_bytes_max = self.response_body_bytes_max;
        c.protocol = self.protocol();
        c.alarm_prepare_ms = self.alarm_prepare_ms;
        c.idempotency_retention_ms = self.idempotency_retention_ms;
        c.alarm_fire_batch_max = self.alarm_fire_batch_max;
        c.alarm_rehearse = self.alarm_rehearse;
        c.store = StoreLimits {
            value_bytes_max: self.value_bytes_max,
            sql_bytes_max: self.sql_bytes_max,
            sql_params_max: self.sql_params_max,
            key_bytes_max: self.key_bytes_max,
            database_bytes_max: self.database_bytes_max,
            kv_list_entries_max: self.kv_list_entries_max,
            query_result_bytes_max: self.query_result_bytes_max,
            statement_memory_bytes_max: self.statement_memory_bytes_max,
            statement_temp_file_bytes_max: self.statement_temp_file_bytes_max,
            page_bytes: self.sqlite_page_bytes,
        };
        c.replica.snapshot_every_entries = self.replica_snapshot_every_entries.max(1);
        c.replica.snapshot_log_ratio_pct = self.replica_snapshot_log_ratio_pct.max(1);
        c.replica.snapshot_log_bytes_min = self.replica_snapshot_log_bytes_min;
        c.replica.snapshots_keep = self.replica_snapshots_keep.max(1);
        c.replica.snapshot_part_bytes = self
            .replica_snapshot_part_bytes
            .max(wasmkeep_replica::limits::SNAPSHOT_PART_BYTES_MIN);
        // A first upload and every snapshot carry the whole database, and
        // nothing read from the bucket may be larger (issue 17).
        c.replica.entry_bytes_max =
            wasmkeep_replica::ReplicaConfig::entry_bytes_max_for(self.database_bytes_max);
        // What a listing holds and a restore replays is bounded (issue 17)
        // well above what the snapshot policy above leaves an honest chain.
        c.replica.raise_bounds_to_retention();
        c.restore_refused_retry_ms = self.restore_refused_retry_ms;
        c.replica_upload_interval_ms = self.replica_upload_interval_ms;
        c.cluster = self.advertise.is_some() && self.bucket.is_some();
        c.outbox.pending_max = self.outbox_pending_max;
        c.outbox.body_bytes_max = self.outbox_body_bytes_max;
        c.outbox.context_bytes_max = self.outbox_context_bytes_max;
        c.outbox.attempts_max = self.outbox_attempts_max;
        c.outbox.retry_first_ms = self.outbox_retry_first_ms;
        c.outbox.retry_max_ms = self.outbox_retry_max_ms;
        c.outbox.response_attempts_max = self.outbox_response_attempts_max;
        c.outbox.in_flight_max = self.outbox_in_flight_max;
        c.outbox.per_actor_max = self.outbox_per_actor_max;
        c.outbox.node_bytes_max = self.outbox_node_bytes_max;
        c.outbound.timeout_ms_max = self.outbound_timeout_ms_max;
        c.outbound.response_bytes_max = self.outbound_response_bytes_max;
        c.outbound.per_actor_max = self.outbound_per_actor_max;
        c.outbound.per_app_max = self.outbound_per_app_max;
        c.outbound.private_allowed = self.outbound_private_allowed;
        c.parked.reply_ms_max = self.parked_reply_ms_max;
        c.parked.node_max = self.parked_replies_max;
        c.parked.per_actor_max = self.parked_per_actor_max;
        c.parked.per_tenant_max = self.parked_per_tenant_max;
        c.sockets.per_actor_max = self.sockets_per_actor_max;
        c.sockets.per_tenant_max = self.sockets_per_tenant_max;
        c.sockets.node_max = self.sockets_max;
        c.sockets.message_bytes_max = self.socket_message_bytes_max;
        c.sockets.send_buffer_bytes_max = self.socket_send_buffer_bytes_max;
        c.sockets.idle_ms = self.socket_idle_ms;
        c.logs.lines_max = self.log_buffer_lines;
        c.logs.bytes_max = self.log_buffer_bytes;
        c.logs.followers_max = self.log_followers_max;
        c.metrics_classes_max = self.metrics_classes_max;
        c.metrics_census_ms = self.metrics_census_ms;
        c
    }

    pub(crate) fn server(&self) -> ServerConfig {
        let replicated_by_default = match self.default_durability {
            Some(d) => d == ReplyDurability::Replicated,
            None => self.advertise.is_some(),
        };
        ServerConfig {
            replicated_by_default,
            request_body_bytes_max: self.request_body_bytes_max,
            admin_token: self.admin_token.clone(),
            tenant_tokens: self.tenant_tokens.clone(),
            list_actors_max: self.list_actors_max,
            inspect_rows_max: self.inspect_rows_max,
            connections_max: self.connections_max,
            header_read_timeout_ms: self.header_read_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            body_read_timeout_ms: self.body_read_timeout_ms,
            body_read_bytes_per_s_min: self.body_read_bytes_per_s_min,
            shutdown_drain_ms: self.shutdown_drain_ms,
            unsafe_rules: Default::default(),
            cluster: None,
            test_clock: None,
            access_log: self.access_log,
            failed_request_log_per_s: self.failed_request_log_per_s,
            sockets_per_client_max: self.sockets_per_client_max,
            trace_sample_pct: self.trace_sample_pct,
            otlp_endpoint: self.otlp_endpoint.clone(),
        }
    }

    /// Cluster mode's settings, when `advertise` and `bucket` are both set:
    /// `--bucket` alone keeps single-node replication.
    pub(crate) fn cluster(
        &self,
    ) -> anyhow::Result<Option<wasmkeep_server::cluster::ClusterSettings>> {
        if self.default_durability == Some(ReplyDurability::Replicated) && self.bucket.is_none() {
            anyhow::bail!(
                "refusing to start: default_durability = \"replicated\" needs a bucket \
                 (--bucket URL)"
            );
        }
        let Some(advertise) = &self.advertise else {
            if let Some(id) = &self.cluster_node_id {
                anyhow::bail!(
                    "refusing to start: cluster_node_id = \"{id}\" names a cluster node, which needs advertise and a bucket"
                );
            }
            return Ok(None);
        };
        if self.bucket.is_none() {
            anyhow::bail!(
                "refusing to start: advertise={advertise} needs a bucket (--bucket URL): a \
                 cluster's nodes share one"
            );
        }
        // The protocol, the idle release and the relayed answer's bound
        // follow from the runtime's settings, their one source.
        let mut settings = wasmkeep_server::cluster::ClusterSettings::new(
            advertise,
            self.cluster_token.clone(),
            &self.runtime(),
        );
        settings.bucket_timeout_ms = self.cluster_bucket_timeout_ms;
        settings.forward_timeout_ms = self.cluster_forward_timeout_ms;
        settings.owner_cache_ttl_ms = self.cluster_owner_cache_ttl_ms;
        settings.actors_max = self.cluster_actors_max;
        settings.deploy_sync_ms = self.cluster_deploy_sync_ms;
        settings.rebalance_moves_per_s = self.cluster_rebalance_moves_per_s;
        settings.node_id = self.cluster_node_id.clone();
        settings
            .check()
            .map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?;
        Ok(Some(settings))
    }

    /// Refuses to expose a node without tokens, unless told it is fine, and
    /// settings the server refuses (tenant tokens without an admin token
    /// above all); run once the flags are applied, before anything starts.
    pub(crate) fn check_exposure(&self) -> anyhow::Result<()> {
        self.check_settings()
            .map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?;
        self.server()
            .check()
            .map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?;
        let loopback = self.listen.ip().is_loopback();
        // A cluster without a configured secret shares the one its first
        // node wrote into the bucket: requests between nodes are signed
        // with it, and it never crosses the network (issue 33).
        self.cluster()?;
        let has_tokens = self.admin_token.is_some();
        if !loopback && !has_tokens && !self.insecure {
            anyhow::bail!(
                "refusing to listen on {} without an admin token: set admin_token (and tenant_tokens), \
                 or pass --insecure if this network is trusted (actors are then open to it; the \
                 admin API stays loopback-only)",
                self.listen
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a restore lists and replays is bounded above what the snapshot
    /// settings leave an honest chain, and the refusal back-off reaches
    /// the runtime.
    #[test]
    fn replica_bounds_follow_the_snapshot_settings() {
        let c = NodeConfig {
            replica_snapshot_every_entries: 100_000,
            replica_snapshots_keep: 4,
            restore_refused_retry_ms: 5,
            replica_upload_interval_ms: 6,
            ..NodeConfig::default()
        };
        let rt = c.runtime();
        assert!(rt.replica.restore_entries_max >= 200_000);
        assert!(rt.replica.listing_keys_max >= 5 * 100_000);
        assert!(rt.replica.restore_bytes_max >= 3 * rt.replica.entry_bytes_max);
        assert_eq!(rt.restore_refused_retry_ms, 5);
        assert_eq!(rt.replica_upload_interval_ms, 6);
        let d = NodeConfig::default().runtime();
        assert_eq!(d.replica, wasmkeep_runtime::RuntimeConfig::new("x").replica);
    }

    #[test]
    fn every_config_field_is_documented() {
        let readme = include_str!("../../../README.md");
        let fields = serde_json::to_value(NodeConfig::default()).unwrap();
        for key in fields.as_object().unwrap().keys() {
            assert!(
                readme.contains(&format!("| `{key}` |")),
                "README's configuration table lacks `{key}`"
            );
        }
    }

    #[test]
    fn a_public_address_needs_a_token_or_insecure() {
        let mut c = NodeConfig {
            listen: "0.0.0.0:8080".parse().unwrap(),
            ..NodeConfig::default()
        };
        assert!(c.check_exposure().is_err());
        c.insecure = true;
        assert!(c.check_exposure().is_ok());
        c.insecure = false;
        c.admin_token = Some("x".into());
        assert!(c.check_exposure().is_ok());
        assert!(NodeConfig::default().check_exposure().is_ok());
    }

    #[test]
    fn tenant_tokens_without_an_admin_token_are_refused_insecure_or_not() {
        let mut c: NodeConfig = toml::from_str("[tenant_tokens]\nacme = \"t\"\n").unwrap();
        for insecure in [false, true] {
            c.insecure = insecure;
            let e = c.check_exposure().unwrap_err().to_string();
            assert!(e.contains("admin_token") && e.contains("acme"), "{e}");
        }
        c.admin_token = Some("root".into());
        assert!(c.check_exposure().is_ok());
    }

    #[test]
    fn edge_limits_reach_the_server_and_zero_timeouts_are_refused() {
        let c: NodeConfig = toml::from_str(
            "connections_max = 3\nheader_read_timeout_ms = 4\nidle_timeout_ms = 5\n\
             body_read_timeout_ms = 6\nbody_read_bytes_per_s_min = 7\nshutdown_drain_ms = 8\n",
        )
        .unwrap();
        let s = c.server();
        let got = [
            s.connections_max as u64,
            s.header_read_timeout_ms,
            s.idle_timeout_ms,
            s.body_read_timeout_ms,
            s.body_read_bytes_per_s_min,
            s.shutdown_drain_ms,
        ];
        assert_eq!(got, [3, 4, 5, 6, 7, 8]);
        let zero = [
            "connections_max",
            "header_read_timeout_ms",
            "idle_timeout_ms",
        ];
        for bad in zero.map(|k| format!("{k} = 0")) {
            let c: NodeConfig = toml::from_str(&bad).unwrap();
            let e = c.check_exposure().unwrap_err().to_string();
            assert!(e.contains(bad.split(' ').next().unwrap()), "{e}");
        }
    }

    #[test]
    fn app_limit_ceilings_and_component_bounds_reach_the_runtime() {
        let c: NodeConfig = toml::from_str(
            "component_memories_max = 3\nevent_log_lines_max = 5\n\
             [app_limit_ceilings]\nevent_cpu_ms_max = 600000\n",
        )
        .unwrap();
        let rt = c.runtime();
        assert_eq!(rt.app_limit_ceilings.event_cpu_ms_max, Some(600_000));
        assert_eq!((rt.component_memories_max, rt.event_log_lines_max), (3, 5));
        assert!(toml::from_str::<NodeConfig>("[app_limit_ceilings]\ncpu_ms = 1\n").is_err());
    }

    /// A cluster node answers `replicated` by default, a single node
    /// `local`; the setting overrides either, and `replicated` needs a
    /// bucket.
    #[test]
    fn a_cluster_node_replicates_replies_by_default() {
        let mut c = NodeConfig::default();
        assert!(!c.server().replicated_by_default);
        c.bucket = Some("file:///tmp/b".into());
        assert!(!c.server().replicated_by_default, "--bucket alone: local");
        c.advertise = Some("http://127.0.0.1:8080".into());
        assert!(c.server().replicated_by_default);
        c.default_durability = Some(ReplyDurability::Local);
        assert!(!c.server().replicated_by_default);
        let mut single: NodeConfig = toml::from_str("default_durability = \"replicated\"").unwrap();
        assert!(
            single
                .cluster()
                .unwrap_err()
                .to_string()
                .contains("default_durability")
        );
        single.bucket = Some("file:///tmp/b".into());
        assert!(single.server().replicated_by_default);
        assert!(toml::from_str::<NodeConfig>("default_durability = \"fsync\"").is_err());
    }

    #[test]
    fn the_alarm_backoff_reaches_the_runtime_and_the_clusters_sweep() {
        let c: NodeConfig = toml::from_str(
            "alarm_retry_first_ms = 250\nalarm_retry_max_ms = 7000\n\
             advertise = \"http://127.0.0.1:8080\"\nbucket = \"file:///tmp/b\"\n",
        )
        .unwrap();
        let rt = c.runtime();
        assert_eq!(
            (rt.protocol.retry_first_ms, rt.protocol.retry_max_ms),
            (250, 7000)
        );
        let p = c.cluster().unwrap().unwrap().protocol;
        assert_eq!((p.retry_first_ms, p.retry_max_ms), (250, 7000));
    }

    #[test]
    fn cluster_mode_needs_advertise_and_bucket() {
        let mut c = NodeConfig {
            bucket: Some("file:///tmp/b".into()),
            ..NodeConfig::default()
        };
        assert!(c.cluster().unwrap().is_none(), "--bucket alone: one node");
        c.advertise = Some("http://127.0.0.1:8080".into());
        c.lease_period_ms = 900;
        c.owner_margin_ms = 100;
        let s = c.cluster().unwrap().unwrap();
        assert_eq!(s.protocol.lease_period_ms, 900);
        assert_eq!(s.protocol.lease_renew_ms(), 300);
        assert!(c.check_exposure().is_ok());
        // Off loopback too: without `cluster_token` the bucket's secret
        // signs what nodes send each other.
        c.listen = "0.0.0.0:8080".parse().unwrap();
        c.insecure = true;
        assert!(c.check_exposure().is_ok());
        c.owner_margin_ms = 800;
        assert!(
            c.cluster()
                .unwrap_err()
                .to_string()
                .contains("owner_margin_ms")
        );
        c.owner_margin_ms = 100;
        c.advertise = Some("127.0.0.1:8080".into());
        assert!(c.cluster().is_err());
        c.advertise = Some("http://127.0.0.1:8080".into());
        c.bucket = None;
        assert!(c.cluster().unwrap_err().to_string().contains("bucket"));
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<NodeConfig>("listne = \"127.0.0.1:1\"").is_err());
        let c: NodeConfig =
            toml::from_str("durability = \"process\"\nvalue_bytes_max = 10").unwrap();
        assert_eq!(c.durability, Durability::Process);
        assert_eq!(c.runtime().store.value_bytes_max, 10);
    }

    #[test]
    fn a_page_size_sqlite_cannot_take_is_refused_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        for bad in ["1000", "256", "131072"] {
            std::fs::write(&path, format!("sqlite_page_bytes = {bad}")).unwrap();
            let e = NodeConfig::load(&path).unwrap_err().to_string();
            assert!(e.contains("`sqlite_page_bytes`") && e.contains(bad), "{e}");
        }
        std::fs::write(&path, "sqlite_page_bytes = 1024").unwrap();
        let c = NodeConfig::load(&path).unwrap();
        assert_eq!(c.runtime().store.page_bytes, 1024);
    }
}
