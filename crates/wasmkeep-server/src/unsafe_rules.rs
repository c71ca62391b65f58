//! Safety rules of the edge and the admin API that a test can switch off,
//! so that each rule's test is shown to fail without it (the unsafe
//! variants `docs/limits.md` names beside each test).
//!
//! Every rule is on in every build. Only a build with the `test-faults`
//! feature (the CLI crate's tests turn it on) reads [`ENV`]; a release
//! build has no way to switch a rule off.

/// The environment variable a `test-faults` build reads: rule names,
/// separated by commas.
pub const ENV: &str = "WASMKEEP_UNSAFE";

/// Rules switched off; all `false` unless a `test-faults` build was asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnsafeRules {
    /// `no_connection_cap`: every connection is served, `connections_max`
    /// or not.
    pub no_connection_cap: bool,
    /// `no_head_or_idle_timeouts`: a request head and an idle connection
    /// may take for ever.
    pub no_head_or_idle_timeouts: bool,
    /// `no_body_pace`: a request body may arrive as slowly as it likes.
    pub no_body_pace: bool,
    /// `keep_framing_headers`: an actor's `content-length`,
    /// `transfer-encoding`, ... reach the wire.
    pub keep_framing_headers: bool,
    /// `admin_open_to_network`: without an admin token, the admin API
    /// answers any peer and any `Host`.
    pub admin_open_to_network: bool,
    /// `admin_takes_any_page`: the admin API answers browser pages of
    /// any origin.
    pub admin_takes_any_page: bool,
    /// `no_sql_allow_list`: guest SQL may call any function, pragma and
    /// virtual-table module, and SQLite's escape hatches stay open
    /// (process-wide; see [`UnsafeRules::apply_to_process`]).
    pub no_sql_allow_list: bool,
    /// `no_stack_rule`: workers run on Rust's default 2 MiB stacks and
    /// calls into SQLite do not check the stack left (process-wide; see
    /// `wasmkeep_store::stack`).
    pub no_stack_rule: bool,
    /// `no_request_body_pool`: request bodies are read without reserving
    /// them in the node's pool (any number, any size within the limit).
    pub no_request_body_pool: bool,
    /// `no_socket_buffer_pool`: what WebSockets read is not counted (any
    /// number of unfinished messages, each up to its bound).
    pub no_socket_buffer_pool: bool,
    /// `console_without_csrf`: a console session's cookie alone opens the
    /// admin API, without its CSRF value (so any page of the node's origin
    /// could use an operator's session).
    pub console_without_csrf: bool,
    /// `actor_answer_unfiltered`: an actor's answer may carry
    /// `Service-Worker-Allowed`, `Clear-Site-Data` and the console's
    /// cookie, and the requests it gets carry the console's cookie.
    pub actor_answer_unfiltered: bool,
    /// `migration_forgets_bucket_actors`: a class migration on a node
    /// with a bucket moves only the actors on the node's disk, as without
    /// a bucket (process-wide; see
    /// `wasmkeep_runtime::class_migrations::unsafe_forget_bucket_actors`).
    pub migration_forgets_bucket_actors: bool,
    /// `migration_crashes_mid_way`: not a rule but a crash point, for the
    /// test of a start that finishes a migration: the process aborts once
    /// a class migration with a bucket restored its first actor at the new
    /// address, before deleting it at the old one.
    pub migration_crashes_mid_way: bool,
    /// `migration_takes_closed_classes`: a cluster node routes (and so
    /// takes) actors of classes a migration closed, as if open (ADR 0071;
    /// process-wide, see `crate::cluster::unsafe_take_closed_classes`).
    pub migration_takes_closed_classes: bool,
    /// `migration_skips_settle`: a moved actor's alarm is not listed in the
    /// cluster's index before its old address is deleted (process-wide,
    /// see `wasmkeep_runtime::class_migrations::unsafe_skip_settle`).
    pub migration_skips_settle: bool,
}

impl UnsafeRules {
    /// The rules named in `list` (comma-separated) switched off.
    pub fn parse(list: &str) -> Result<UnsafeRules, String> {
        let mut r = UnsafeRules::default();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let flag = match name {
                "no_connection_cap" => &mut r.no_connection_cap,
                "no_head_or_idle_timeouts" => &mut r.no_head_or_idle_timeouts,
                "no_body_pace" => &mut r.no_body_pace,
                "keep_framing_headers" => &mut r.keep_framing_headers,
                "admin_open_to_network" => &mut r.admin_open_to_network,
                "admin_takes_any_page" => &mut r.admin_takes_any_page,
                "no_sql_allow_list" => &mut r.no_sql_allow_list,
                "no_stack_rule" => &mut r.no_stack_rule,
                "no_request_body_pool" => &mut r.no_request_body_pool,
                "no_socket_buffer_pool" => &mut r.no_socket_buffer_pool,
                "console_without_csrf" => &mut r.console_without_csrf,
                "actor_answer_unfiltered" => &mut r.actor_answer_unfiltered,
                "migration_forgets_bucket_actors" => &mut r.migration_forgets_bucket_actors,
                "migration_crashes_mid_way" => &mut r.migration_crashes_mid_way,
                "migration_takes_closed_classes" => &mut r.migration_takes_closed_classes,
                "migration_skips_settle" => &mut r.migration_skips_settle,
                _ => return Err(format!("{ENV}: unknown rule `{name}`")),
            };
            *flag = true;
        }
        Ok(r)
    }

    /// What [`ENV`] switches off in a `test-faults` build; nothing in any
    /// other build, whatever the environment says.
    pub fn from_env() -> Result<UnsafeRules, String> {
        if cfg!(feature = "test-faults") {
            UnsafeRules::parse(&std::env::var(ENV).unwrap_or_default())
        } else {
            Ok(UnsafeRules::default())
        }
    }

    /// Switches off, before the runtime opens any database, the rules that
    /// live below the server (the guest SQL allow-list).
    pub fn apply_to_process(&self) {
        #[cfg(feature = "test-faults")]
        if self.no_sql_allow_list {
            wasmkeep_store::sandbox::unsafe_drop_allow_list();
        }
        #[cfg(feature = "test-faults")]
        if self.no_stack_rule {
            wasmkeep_store::stack::unsafe_drop_stack_rule();
        }
        #[cfg(feature = "test-faults")]
        if self.migration_forgets_bucket_actors {
            wasmkeep_runtime::class_migrations::unsafe_forget_bucket_actors();
        }
        #[cfg(feature = "test-faults")]
        if self.migration_crashes_mid_way {
            wasmkeep_runtime::class_migrations::crash_after_first_restore();
        }
        #[cfg(feature = "test-faults")]
        if self.migration_takes_closed_classes {
            crate::cluster::unsafe_take_closed_classes();
        }
        #[cfg(feature = "test-faults")]
        if self.migration_skips_settle {
            wasmkeep_runtime::class_migrations::unsafe_skip_settle();
        }
    }

    /// Whether any rule is off.
    pub fn any(&self) -> bool {
        *self != UnsafeRules::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_ones_are_refused() {
        let r = UnsafeRules::parse("no_body_pace, admin_takes_any_page").unwrap();
        assert!(r.no_body_pace && r.admin_takes_any_page && r.any());
        assert!(!r.no_connection_cap);
        assert!(!UnsafeRules::parse("").unwrap().any());
        assert!(
            UnsafeRules::parse("no_sandbox")
                .unwrap_err()
                .contains("no_sandbox")
        );
    }
}
