//! The actor's instance: compiling it into a store over its database
//! (`instantiate`, `load`), entering a call with its fuel and deadline,
//! `on-init` on first use, and turning a call's end (a trap, a guest error)
//! into the event's outcome.

use super::*;

pub(super) fn instantiate(
    rt: &Arc<Inner>,
    app: &Arc<App>,
    id: &ActorId,
    db: ActorDb,
) -> Result<Loaded, Box<(RuntimeError, Option<ActorDb>)>> {
    let started = crate::clock::instant();
    let mut state = HostState::new(
        Some(db),
        id.clone(),
        Arc::clone(&rt.clock),
        rt.config.instance_memory_bytes_max,
    );
    state.alarm_statements = app.alarm_statements.for_class(&id.class);
    if rt.faults.unsafe_outbox_before_commit() {
        state.sent_before_commit = Some(Vec::new());
    }
    let parked: Arc<dyn crate::replies::Tickets> = rt.parked.clone();
    state.parked = Some(parked);
    state.sockets = Some(Arc::clone(&rt.sockets));
    state.bucket = rt.replication.is_some();
    state.logs = Some(Arc::clone(&rt.logs));
    state.response_body_bytes_max = rt.config.response_body_bytes_max;
    state.config = crate::app_config::InstanceConfig {
        vars: Arc::clone(&app.vars),
        secrets: rt.secrets.of(&id.tenant, &id.app),
    };
    state.outbox = crate::outbox::OutboxSettings {
        limits: rt.config.outbox.clone(),
        policy: Arc::clone(&app.outbound),
    };
    state.log_budget = crate::log_budget::LogBudget::new(
        rt.config.event_log_lines_max,
        rt.config.event_log_bytes_max,
    );
    let mut store = Store::new(&rt.engine, state);
    store.limiter(|s| &mut s.memory);
    store.set_epoch_deadline(epoch_ticks(app.event_cpu_ms_max));
    let instantiated = app
        .pre
        .instance_pre()
        .instantiate(&mut store)
        .and_then(|instance| {
            let bindings = app.indices.load(&mut store, &instance)?;
            let inbox = match &app.inbox {
                Some(i) => Some(i.load(&mut store, &instance)?),
                None => None,
            };
            let sockets = match &app.socket_handler {
                Some(i) => Some(i.load(&mut store, &instance)?),
                None => None,
            };
            Ok((bindings, inbox, sockets))
        });
    match instantiated {
        Ok((bindings, inbox, socket_handler)) => {
            rt.metrics
                .phase_instantiate
                .observe_ms(started.elapsed().as_secs_f64() * 1000.0);
            rt.metrics.instances_active.inc();
            Metrics::inc(&rt.metrics.instantiations_total);
            Ok(Loaded {
                store,
                bindings: Some(bindings),
                inbox,
                socket_handler,
                app: Arc::clone(app),
                metrics: Arc::clone(&rt.metrics),
                recording: None,
                recording_clear: false,
                recording_paused_until_ms: 0,
            })
        }
        Err(e) => {
            let state = store.data_mut();
            let db = state.db.take();
            let err = if state.memory.node_refused {
                RuntimeError::Store(wasmkeep_store::StoreError::NodeMemoryExhausted {
                    limit: wasmkeep_store::memory_budget::node_bytes_max(),
                })
            } else {
                RuntimeError::Internal(format!("instantiate: {e:#}"))
            };
            Err(Box::new((err, db)))
        }
    }
}

/// Drops the instance in `slot` if the bucket no longer agrees with its
/// state (the actor was given up) or the copy is from before a lapse of
/// the node's lease: whatever reads the actor next (an event, an
/// inspection) opens it afresh from the bucket rather than read the
/// commits it gave up. (A class migration's copy finds no instance: the
/// migration closes the class's actors first.)
pub(super) fn drop_if_disowned(rt: &Inner, actor: &Actor, slot: &mut Option<Loaded>) {
    if rt.replication.is_some() && {
        let st = actor.repl.lock();
        st.given_up() || (rt.keeps_index() && st.stale_epoch(rt.gate_epoch()))
    } {
        *slot = None;
    }
}

/// A current instance of the actor, taken out of `slot` (the turn owns it
/// while it runs, and puts it back if the actor stays open) or made
/// afresh; `Ok(None)` if the actor has no database and `create` is false.
pub(super) fn load(
    rt: &Arc<Inner>,
    actor: &Actor,
    app: &Arc<App>,
    slot: &mut Option<Loaded>,
    create: bool,
) -> Result<Option<Loaded>, RuntimeError> {
    let id = &actor.id;
    drop_if_disowned(rt, actor, slot);
    // The same version keeps its instance; so does an older one while a
    // deferred deploy waits for the actor to close (ADR 0059): only on the
    // way forward, so a lowered rollout share still moves actors back.
    if let Some(l) = slot.take_if(|l| {
        l.bindings.is_some()
            && (l.app.version == app.version
                || (app.deferred
                    && l.app.name == app.name
                    && l.app.deploy_version < app.deploy_version))
    }) {
        return reopened(rt, id, l).map(Some);
    }
    let db = match slot.take().and_then(Loaded::take_open_db) {
        Some(db) => db,
        None => {
            if let Some(repl) = &rt.replication {
                replication::ensure_open(rt, repl, actor)?;
            }
            let mode = if create {
                OpenMode::Create
            } else {
                OpenMode::Existing
            };
            let dir = paths::actor_dir(&rt.config.data_dir, id);
            if create && !dir.join(paths::DB_FILE).exists() {
                // A new actor: within its tenant's quota, or not at all.
                rt.quotas.may_create(&id.tenant)?;
            }
            rt.make_room_for_database(id);
            match ActorDb::open(&dir, &app.store_limits, mode)? {
                Some(db) => {
                    if db.created() {
                        rt.quotas.counted(&id.tenant, true, 0);
                        // Seen at once, not at the next census (which
                        // then sets the count it finds on disk).
                        if let Some(c) = rt.class_metrics.of(id) {
                            c.actors.inc();
                        }
                    }
                    db.set_stop_flag(Arc::clone(&rt.stopping));
                    if rt.replication.is_some() {
                        replication::after_open(actor, &db)?;
                    }
                    db
                }
                None => return Ok(None),
            }
        }
    };
    rt.make_room(id);
    let failed = match instantiate(rt, app, id, db) {
        Ok(l) => return Ok(Some(l)),
        Err(failed) => failed,
    };
    let (err, db) = *failed;
    let (RuntimeError::Store(StoreError::NodeMemoryExhausted { .. }), Some(db)) = (&err, db) else {
        return Err(err);
    };
    // Tenants' memory is full. Idle instances hold most of it (an actor
    // that grew its memory and went quiet keeps it until it is closed):
    // close the least recently used ones and try once more, so that one
    // tenant's idle actors cannot keep every other actor from opening.
    if rt.evict_for_memory(id) == 0 {
        return Err(err);
    }
    match instantiate(rt, app, id, db) {
        Ok(l) => Ok(Some(l)),
        Err(failed) => Err(failed.0),
    }
}

/// An instance kept for this turn, its database opened again if
/// `make_room_for_database` closed it (ADR 0068).
fn reopened(rt: &Arc<Inner>, id: &ActorId, mut l: Loaded) -> Result<Loaded, RuntimeError> {
    if !l.has_db() {
        rt.make_room_for_database(id);
        l.reopen_db(rt, id)?;
    }
    Ok(l)
}

pub(super) fn trap_error(
    e: wasmtime::Error,
    state: &mut HostState,
    cpu_ms_max: u64,
) -> RuntimeError {
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return RuntimeError::CpuTimeExceeded { limit: cpu_ms_max };
    }
    if let Some(e) = memory_refused(state) {
        return e;
    }
    match state.panic_message.take() {
        Some(p) => RuntimeError::Trap(format!("panicked: {p}")),
        None => RuntimeError::Trap(format!("{e:#}")),
    }
}

/// The error of an event in which the node refused the guest memory: its
/// instance's cap, or the node's budget. A guest that fails after that,
/// whether it trapped or caught the failure and returned an error (a
/// JavaScript engine turns a refused `memory.grow` into its own "out of
/// memory" exception), fails with the limit's name, not its own words.
fn memory_refused(state: &HostState) -> Option<RuntimeError> {
    if state.memory.node_refused {
        return Some(RuntimeError::Store(
            wasmkeep_store::StoreError::NodeMemoryExhausted {
                limit: wasmkeep_store::memory_budget::node_bytes_max(),
            },
        ));
    }
    state
        .memory
        .exceeded
        .then_some(RuntimeError::MemoryExceeded {
            limit: state.memory.bytes_max,
        })
}

/// Prepares the instance's per-event state before calling into it.
pub(super) fn enter(l: &mut Loaded) {
    let cpu_ms = l.app.event_cpu_ms_max;
    l.store.set_epoch_deadline(epoch_ticks(cpu_ms));
    let s = l.store.data_mut();
    // The guest's statements stop at the same deadline as its code: the
    // wasm deadline cannot interrupt a host call into SQLite.
    if let Some(db) = &s.db {
        db.set_deadline(Some(
            crate::clock::instant() + std::time::Duration::from_millis(cpu_ms),
        ));
    }
    s.sql_stopped = None;
    s.memory.exceeded = false;
    s.memory.node_refused = false;
    s.panic_message = None;
    s.poison = None;
    s.in_alarm = false;
}

/// Calls `on-init` if the actor has not committed one yet. Runs inside the
/// event's savepoint, so a failing first event leaves no trace of init.
pub(super) fn ensure_init(
    rt: &Inner,
    l: &mut Loaded,
    initialized: &mut bool,
) -> Result<(), RuntimeError> {
    if *initialized {
        return Ok(());
    }
    enter(l);
    let class = l.store.data().id.class.clone();
    // Init runs once in an actor's life: its statements are not kept.
    l.db().keep_statements(false);
    let bindings = l.bindings.as_ref().expect("instance is live");
    let r = bindings
        .wasmkeep_actor_handler()
        .call_on_init(&mut l.store, &class);
    l.db().keep_statements(true);
    finish_call(l, r)?;
    l.db().mark_initialized(rt.clock.now_ms())?;
    *initialized = true;
    Ok(())
}

/// Turns the result of a guest call into the event's result, dropping the
/// instance after a trap.
pub(super) fn finish_call<T>(
    l: &mut Loaded,
    r: wasmtime::Result<Result<T, host::WitError>>,
) -> Result<T, RuntimeError> {
    let cpu = l.app.event_cpu_ms_max;
    let s = l.store.data_mut();
    let dropped = s.log_budget.finish_call(&s.id);
    l.metrics.guest_log_lines_dropped_total.inc_by(dropped);
    if let Some(stop) = l.store.data_mut().sql_stopped.take() {
        // A statement was stopped at the deadline (or by the node
        // stopping): the event fails for it even if the guest swallowed
        // the error and went on.
        if r.is_err() {
            l.bindings = None;
        }
        return Err(match stop {
            host::SqlStopped::Deadline => RuntimeError::CpuTimeExceeded { limit: cpu },
            host::SqlStopped::Stopping => RuntimeError::ShuttingDown,
        });
    }
    if r.is_ok() && super::awaiting::waits(l) {
        // The handler waited for an answer it does not have: whatever it
        // did next, its run rolls back and the event is suspended (ADR
        // 0056).
        return Err(RuntimeError::Guest {
            code: "suspended".into(),
            message: "the event waits for an answer".into(),
        });
    }
    match r {
        Ok(Ok(v)) => match l.store.data_mut().poison.take() {
            Some(e) => Err(RuntimeError::Guest {
                code: e.code,
                message: e.message,
            }),
            None => Ok(v),
        },
        // The guest's own words reach callers and the node's log: without
        // the app's secret values (ADR 0041).
        Ok(Err(e)) => Err(match memory_refused(l.store.data()) {
            Some(refused) => refused,
            None => RuntimeError::Guest {
                code: e.code,
                message: l.store.data().config.scrub(e.message),
            },
        }),
        Err(e) => {
            // A trapped instance may not be entered again.
            l.bindings = None;
            let state = l.store.data_mut();
            let err = trap_error(e, state, cpu);
            Err(match err {
                RuntimeError::Trap(m) => RuntimeError::Trap(state.config.scrub(m)),
                other => other,
            })
        }
    }
}

/// Releases the event's savepoint. When SQLite abandoned the whole
/// transaction under the guest (a full database, the tenant's quota), the
/// event fails with that statement's error, whatever the guest made of
/// it, rather than with the savepoint SQLite dropped.
pub(super) fn commit_event(l: &mut Loaded) -> Result<(), RuntimeError> {
    if let Some(e) = l.store.data_mut().tx_lost.take()
        && !l.db().in_transaction()
    {
        return Err(RuntimeError::Guest {
            code: e.code,
            message: e.message,
        });
    }
    Ok(l.db().event_commit()?)
}

/// Ends an event begun with `event_begin` that answers nothing but done:
/// kept if its handler succeeded, rolled back if it failed.
pub(super) fn end_event(
    l: &mut Loaded,
    r: Result<(), RuntimeError>,
) -> Result<Outcome, RuntimeError> {
    match r {
        Ok(()) => {
            commit_event(l)?;
            Ok(Outcome::Done)
        }
        Err(e) => {
            if l.db().in_transaction() {
                l.db().event_rollback()?;
            }
            Err(e)
        }
    }
}
