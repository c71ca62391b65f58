//! A node's configuration: a TOML file, then flags on top.
//!
//! Every field is documented in the README's configuration table; a test
//! (`every_config_field_is_documented`) keeps the two in step.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use wasmkeep_runtime::{Durability, RuntimeConfig, StoreLimits};
use wasmkeep_server::ServerConfig;

/// Everything `wasmkeep serve` can be told. Field names are the TOML keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    pub listen: SocketAddr,
    pub data: PathBuf,
    pub durability: Durability,
    pub admin_token: Option<String>,
    pub tenant_tokens: BTreeMap<String, String>,
    pub insecure: bool,
    pub event_cpu_ms_max: u64,
    pub instance_memory_bytes_max: usize,
    pub instances_max: u32,
    pub actor_idle_ms: u64,
    pub actor_queue_events_max: usize,
    pub batch_events_max: usize,
    pub workers: usize,
    pub component_bytes_max: usize,
    pub request_body_bytes_max: usize,
    pub response_body_bytes_max: usize,
    pub value_bytes_max: usize,
    pub sql_bytes_max: usize,
    pub sql_params_max: usize,
    pub key_bytes_max: usize,
    pub database_bytes_max: u64,
    pub kv_list_entries_max: u32,
    pub query_result_bytes_max: usize,
    pub sqlite_page_bytes: u32,
    pub alarm_retry_first_ms: u64,
    pub alarm_retry_max_ms: u64,
    pub alarm_prepare_ms: u64,
    pub alarm_fire_batch_max: usize,
    pub alarm_rehearse: bool,
    pub list_actors_max: usize,
    pub inspect_rows_max: usize,
    pub bucket: Option<String>,
    pub replica_snapshot_every_entries: u64,
    pub replica_snapshot_log_ratio_pct: u64,
    pub replica_snapshot_log_bytes_min: u64,
    pub replica_snapshots_keep: usize,
}

impl Default for NodeConfig {
    fn default() -> Self {
        let rt = RuntimeConfig::new("wasmkeep-data");
        let server = ServerConfig::default();
        let s = StoreLimits::default();
        NodeConfig {
            listen: "127.0.0.1:8080".parse().expect("valid address"),
            data: rt.data_dir.clone(),
            durability: rt.durability,
            admin_token: None,
            tenant_tokens: BTreeMap::new(),
            insecure: false,
            event_cpu_ms_max: rt.event_cpu_ms_max,
            instance_memory_bytes_max: rt.instance_memory_bytes_max,
            instances_max: rt.instances_max,
            actor_idle_ms: rt.actor_idle_ms,
            actor_queue_events_max: rt.actor_queue_events_max,
            batch_events_max: rt.batch_events_max,
            workers: rt.workers,
            component_bytes_max: rt.component_bytes_max,
            request_body_bytes_max: server.request_body_bytes_max,
            response_body_bytes_max: rt.response_body_bytes_max,
            value_bytes_max: s.value_bytes_max,
            sql_bytes_max: s.sql_bytes_max,
            sql_params_max: s.sql_params_max,
            key_bytes_max: s.key_bytes_max,
            database_bytes_max: s.database_bytes_max,
            kv_list_entries_max: s.kv_list_entries_max,
            query_result_bytes_max: s.query_result_bytes_max,
            sqlite_page_bytes: s.page_bytes,
            alarm_retry_first_ms: rt.alarm_retry_first_ms,
            alarm_retry_max_ms: rt.alarm_retry_max_ms,
            alarm_prepare_ms: rt.alarm_prepare_ms,
            alarm_fire_batch_max: rt.alarm_fire_batch_max,
            alarm_rehearse: rt.alarm_rehearse,
            list_actors_max: server.list_actors_max,
            inspect_rows_max: server.inspect_rows_max,
            bucket: None,
            replica_snapshot_every_entries: rt.replica.snapshot_every_entries,
            replica_snapshot_log_ratio_pct: rt.replica.snapshot_log_ratio_pct,
            replica_snapshot_log_bytes_min: rt.replica.snapshot_log_bytes_min,
            replica_snapshots_keep: rt.replica.snapshots_keep,
        }
    }
}

impl NodeConfig {
    pub fn load(path: &std::path::Path) -> anyhow::Result<NodeConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("read config {}: {e}", path.display()))?;
        let c: NodeConfig =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        c.check_settings()
            .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        Ok(c)
    }

    /// Refuses settings no node can run with.
    pub fn check_settings(&self) -> anyhow::Result<()> {
        wasmkeep_store::limits::check_page_bytes("sqlite_page_bytes", self.sqlite_page_bytes)
            .map_err(|e| anyhow::anyhow!(e))
    }

    pub fn runtime(&self) -> RuntimeConfig {
        let mut c = RuntimeConfig::new(&self.data);
        c.durability = self.durability;
        c.event_cpu_ms_max = self.event_cpu_ms_max;
        c.instance_memory_bytes_max = self.instance_memory_bytes_max;
        c.instances_max = self.instances_max;
        c.actor_idle_ms = self.actor_idle_ms;
        c.actor_queue_events_max = self.actor_queue_events_max;
        c.batch_events_max = self.batch_events_max.max(1);
        c.workers = self.workers;
        c.component_bytes_max = self.component_bytes_max;
        c.response_body_bytes_max = self.response_body_bytes_max;
        c.alarm_retry_first_ms = self.alarm_retry_first_ms;
        c.alarm_retry_max_ms = self.alarm_retry_max_ms;
        c.alarm_prepare_ms = self.alarm_prepare_ms;
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
            page_bytes: self.sqlite_page_bytes,
        };
        c.replica.snapshot_every_entries = self.replica_snapshot_every_entries.max(1);
        c.replica.snapshot_log_ratio_pct = self.replica_snapshot_log_ratio_pct.max(1);
        c.replica.snapshot_log_bytes_min = self.replica_snapshot_log_bytes_min;
        c.replica.snapshots_keep = self.replica_snapshots_keep.max(1);
        // A first upload and every snapshot carry the whole database.
        c.replica.entry_bytes_max = c
            .replica
            .entry_bytes_max
            .max(self.database_bytes_max + 1024 * 1024);
        c
    }

    pub fn server(&self) -> ServerConfig {
        ServerConfig {
            request_body_bytes_max: self.request_body_bytes_max,
            admin_token: self.admin_token.clone(),
            tenant_tokens: self.tenant_tokens.clone(),
            list_actors_max: self.list_actors_max,
            inspect_rows_max: self.inspect_rows_max,
            component_bytes_max: self.component_bytes_max,
        }
    }

    /// Refuses to expose a node without tokens, unless told it is fine.
    pub fn check_exposure(&self) -> anyhow::Result<()> {
        let loopback = self.listen.ip().is_loopback();
        let has_tokens = self.admin_token.is_some();
        if !loopback && !has_tokens && !self.insecure {
            anyhow::bail!(
                "refusing to listen on {} without an admin token: set admin_token (and tenant_tokens), \
                 or pass --insecure if this network is trusted",
                self.listen
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
