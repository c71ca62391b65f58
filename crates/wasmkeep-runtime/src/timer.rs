//! The node's in-memory alarm timer.
//!
//! One ordered set of `(due, actor)` for every alarm this node knows of,
//! filled from the events it commits and, at start-up, from a scan of the
//! data directory. No task or thread per alarm: a million pending alarms
//! cost a million small set entries. The actor's database stays the source
//! of truth; an entry here only says "look at this actor then", and a
//! delivery re-reads the committed alarm before running anything.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use wasmkeep_store::ActorId;

#[derive(Default)]
struct State {
    queue: BTreeSet<(u64, Arc<ActorId>)>,
    by_actor: HashMap<Arc<ActorId>, u64>,
    /// Actors already opened ahead of their alarm.
    prepared: HashSet<Arc<ActorId>>,
    /// Failed runs of the pending alarms that failed before (only those
    /// above 0): the alarm index page's "retrying".
    retries: HashMap<Arc<ActorId>, u32>,
}

/// Pending alarms by due time.
#[derive(Default)]
pub struct Timer {
    state: Mutex<State>,
    changed: Condvar,
}

impl Timer {
    /// Records an actor's committed alarm (`None`: it has none). A new due
    /// time forgets the failures noted for the old one; the same one keeps
    /// them.
    pub fn set(&self, id: &ActorId, at_ms: Option<u64>) {
        let mut s = self.state.lock();
        self.set_locked(&mut s, id, at_ms);
    }

    /// [`Timer::set`] with the alarm's failed runs so far (its committed
    /// `retry_count`), under one lock: what the alarm page shows as
    /// retrying.
    pub fn set_alarm(&self, id: &ActorId, alarm: Option<(u64, u32)>) {
        let mut s = self.state.lock();
        self.set_locked(&mut s, id, alarm.map(|(at, _)| at));
        Self::note_retries(&mut s, id, alarm.map_or(0, |(_, r)| r));
    }

    /// Records an alarm read from disk, with its failed runs so far,
    /// unless the timer already holds one for the actor (set by a turn,
    /// which knows better).
    pub fn set_if_absent(&self, id: &ActorId, at_ms: u64, retries: u32) {
        let mut s = self.state.lock();
        if s.by_actor.contains_key(id) {
            return;
        }
        self.set_locked(&mut s, id, Some(at_ms));
        Self::note_retries(&mut s, id, retries);
    }

    fn set_locked(&self, s: &mut State, id: &ActorId, at_ms: Option<u64>) {
        if s.by_actor.get(id).copied() == at_ms {
            // Unchanged (most batches re-read an alarm they did not touch):
            // it stays prepared and in place.
            return;
        }
        let key = match s.by_actor.get_key_value(id) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::new(id.clone()),
        };
        if let Some(old) = s.by_actor.remove(&key) {
            s.queue.remove(&(old, Arc::clone(&key)));
        }
        s.prepared.remove(&key);
        s.retries.remove(&key);
        if let Some(at) = at_ms {
            let earliest = s.queue.first().map(|(t, _)| *t);
            s.queue.insert((at, Arc::clone(&key)));
            s.by_actor.insert(key, at);
            if earliest.is_none_or(|e| at < e) {
                self.changed.notify_all();
            }
        }
    }

    /// Notes the failed runs of `id`'s pending alarm (kept only above 0,
    /// and only for an alarm the timer holds).
    fn note_retries(s: &mut State, id: &ActorId, retries: u32) {
        match s.by_actor.get_key_value(id).map(|(k, _)| Arc::clone(k)) {
            Some(key) if retries > 0 => {
                s.retries.insert(key, retries);
            }
            _ => {
                s.retries.remove(id);
            }
        }
    }

    /// Removes and returns up to `max` alarms due at or before `now_ms`,
    /// earliest first.
    pub fn pop_due(&self, now_ms: u64, max: usize) -> Vec<(ActorId, u64)> {
        let mut s = self.state.lock();
        let mut out = Vec::new();
        while out.len() < max {
            let Some((at, id)) = s.queue.first().cloned() else {
                break;
            };
            if at > now_ms {
                break;
            }
            s.queue.pop_first();
            s.by_actor.remove(&id);
            s.prepared.remove(&id);
            s.retries.remove(&id);
            out.push(((*id).clone(), at));
        }
        out
    }

    /// Actors due before `until_ms` that were not yet prepared, earliest
    /// first, marking them prepared: as many as keep the prepared actors
    /// whose alarm has not been taken yet at most `max`. A bound per call
    /// would not do: a burst larger than the node's instances, prepared
    /// over several calls, would close the first actors prepared (the
    /// least recently used) to open later ones, and the alarms due first
    /// would find their actor closed (ADR 0077).
    pub fn to_prepare(&self, until_ms: u64, max: usize) -> Vec<ActorId> {
        let mut s = self.state.lock();
        let room = max.saturating_sub(s.prepared.len());
        let State {
            queue, prepared, ..
        } = &mut *s;
        let mut out = Vec::new();
        for (_, id) in queue.iter().take_while(|(at, _)| *at <= until_ms) {
            if out.len() >= room {
                break;
            }
            if prepared.insert(Arc::clone(id)) {
                out.push((**id).clone());
            }
        }
        out
    }

    /// The earliest due time.
    pub fn next_due(&self) -> Option<u64> {
        self.state.lock().queue.first().map(|(t, _)| *t)
    }

    /// The alarm this timer holds for an actor.
    pub fn get(&self, id: &ActorId) -> Option<u64> {
        self.state.lock().by_actor.get(id).copied()
    }

    pub fn len(&self) -> usize {
        self.state.lock().by_actor.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A tenant's pending alarms in due order, at most `limit`, each with
    /// the failed runs before it.
    pub fn pending(&self, tenant: &str, limit: usize) -> Vec<(ActorId, u64, u32)> {
        let s = self.state.lock();
        s.queue
            .iter()
            .filter(|(_, id)| id.tenant == tenant)
            .take(limit)
            .map(|(at, id)| {
                let retries = s.retries.get(id).copied().unwrap_or(0);
                ((**id).clone(), *at, retries)
            })
            .collect()
    }

    /// Sleeps until the earliest alarm may be due, something earlier is
    /// set, or `max_ms` passed.
    pub fn wait(&self, now_ms: u64, max_ms: u64) {
        let mut s = self.state.lock();
        let wait_ms = match s.queue.first() {
            Some((at, _)) if *at <= now_ms => return,
            Some((at, _)) => (*at - now_ms).min(max_ms),
            None => max_ms,
        };
        self.changed
            .wait_for(&mut s, std::time::Duration::from_millis(wait_ms));
    }

    /// Wakes a thread in [`Timer::wait`].
    pub fn notify(&self) {
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: &str) -> ActorId {
        ActorId::new("t", "a", "c", n).unwrap()
    }

    #[test]
    fn set_replaces_and_pop_returns_due_in_order() {
        let t = Timer::default();
        t.set(&id("a"), Some(30));
        t.set(&id("b"), Some(10));
        t.set(&id("c"), Some(20));
        t.set(&id("a"), Some(5));
        t.set(&id("c"), None);
        assert_eq!(t.len(), 2);
        assert_eq!(t.pop_due(9, 10), vec![(id("a"), 5)]);
        assert_eq!(t.pop_due(100, 10), vec![(id("b"), 10)]);
        assert!(t.is_empty());
    }

    #[test]
    fn prepare_marks_once_until_the_alarm_changes() {
        let t = Timer::default();
        t.set(&id("a"), Some(10));
        assert_eq!(t.to_prepare(20, 10), vec![id("a")]);
        assert!(t.to_prepare(20, 10).is_empty());
        // Turns re-record an alarm they did not change: still prepared.
        t.set(&id("a"), Some(10));
        assert!(t.to_prepare(20, 10).is_empty());
        t.set(&id("a"), Some(15));
        assert_eq!(t.to_prepare(20, 10), vec![id("a")]);
    }

    #[test]
    fn prepared_actors_waiting_for_their_alarm_stay_within_the_bound() {
        let t = Timer::default();
        for n in ["a", "b", "c", "d", "e"] {
            t.set(&id(n), Some(10));
        }
        assert_eq!(t.to_prepare(20, 2), vec![id("a"), id("b")]);
        // Nothing more while those two wait: a third would close the
        // first one prepared, whose alarm comes first.
        assert!(t.to_prepare(20, 2).is_empty());
        // Once an alarm is taken, its place goes to the next one due.
        assert_eq!(t.pop_due(10, 1), vec![(id("a"), 10)]);
        assert_eq!(t.to_prepare(20, 2), vec![id("c")]);
        // An alarm moved away frees its place too.
        t.set(&id("b"), Some(100));
        assert_eq!(t.to_prepare(20, 2), vec![id("d")]);
    }

    #[test]
    fn the_scan_never_overwrites_what_a_turn_recorded() {
        let t = Timer::default();
        t.set(&id("a"), Some(50));
        t.set_if_absent(&id("a"), 10, 0);
        assert_eq!(t.get(&id("a")), Some(50));
        t.set_if_absent(&id("b"), 10, 0);
        assert_eq!(t.get(&id("b")), Some(10));
    }

    #[test]
    fn failed_runs_belong_to_the_alarm_they_failed() {
        let t = Timer::default();
        let retries = |t: &Timer| t.pending("t", 10).iter().map(|p| p.2).collect::<Vec<_>>();
        t.set_alarm(&id("a"), Some((50, 2)));
        assert_eq!(retries(&t), vec![2]);
        // The same alarm again (a batch that did not touch it): kept.
        t.set(&id("a"), Some(50));
        assert_eq!(retries(&t), vec![2]);
        // Another alarm (set by a turn, restored, moved): not its failures.
        t.set(&id("a"), Some(60));
        assert_eq!(retries(&t), vec![0]);
        t.set_alarm(&id("a"), Some((60, 1)));
        assert_eq!(retries(&t), vec![1]);
        t.set(&id("a"), None);
        t.set(&id("a"), Some(60));
        assert_eq!(retries(&t), vec![0]);
        // The scan's count is taken only for the alarm it read.
        t.set_if_absent(&id("b"), 70, 3);
        t.set_if_absent(&id("b"), 70, 5);
        assert_eq!(retries(&t), vec![0, 3]);
        // Delivered: gone with it.
        t.pop_due(100, 10);
        t.set(&id("b"), Some(200));
        assert_eq!(retries(&t), vec![0]);
    }
}
