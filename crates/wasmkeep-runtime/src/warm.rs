//! The statements a class's alarm handler runs, learned from the handlers
//! that ran, so that an actor opened ahead of its alarm can have them
//! prepared before the due instant (ADR 0026).
//!
//! Prepared statements belong to one SQLite connection, and every actor has
//! its own: without this, each actor parses its handler's SQL for the first
//! time at the moment its alarm is due, which is when thousands of alarms
//! due together compete for the same cores. Every actor of a class runs the
//! same code, so what one actor's handler ran is what the next one's will
//! most likely run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many statements are kept per class. A handler that runs more
/// distinct statements (built with values inside the text, say) gets the
/// first ones warmed and the rest parsed at the due instant, as before.
pub(crate) const ALARM_STATEMENTS_MAX: usize = 16;

/// How long an actor of a class being rehearsed waits for the rehearsal to
/// end before it is prepared without what the rehearsal learns (ADR 0030).
/// A rehearsal takes about a millisecond; one whose handler runs longer
/// does not hold other actors' turns for longer than this.
pub(crate) const REHEARSAL_WAIT_MS_MAX: u64 = 100;

/// The statements learned for one class, first run first.
#[derive(Debug, Default)]
pub struct AlarmStatements {
    texts: Mutex<Vec<Arc<str>>>,
    /// Whether an actor of the class was given the class's one rehearsal
    /// (ADR 0030); held while it runs.
    rehearsal: parking_lot::Mutex<bool>,
}

impl AlarmStatements {
    /// Records a statement an alarm handler of this class ran successfully.
    pub fn note(&self, sql: &str) {
        let mut texts = self.texts.lock().unwrap_or_else(|p| p.into_inner());
        if texts.len() < ALARM_STATEMENTS_MAX && !texts.iter().any(|t| &**t == sql) {
            texts.push(Arc::from(sql));
        }
    }

    /// Whether the class may still need its rehearsal: nothing learned, and
    /// no rehearsal done (one running counts as "may", so that the caller
    /// goes on to wait for it in [`Self::claim_rehearsal`]). A cheap check
    /// before reading anything for a rehearsal.
    pub fn may_need_rehearsal(&self) -> bool {
        self.texts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
            && self.rehearsal.try_lock().is_none_or(|claimed| !*claimed)
    }

    /// The class's one rehearsal of its alarm handler, to run while the
    /// returned guard is held: `Some` once per app version, and only while
    /// nothing was learned (a class whose alarms ran on this node needs
    /// none). While another actor's rehearsal runs, this waits for it (at
    /// most [`REHEARSAL_WAIT_MS_MAX`]), so that the caller is then prepared
    /// with what it learned.
    pub fn claim_rehearsal(&self) -> Option<parking_lot::MutexGuard<'_, bool>> {
        self.claim_rehearsal_within(Duration::from_millis(REHEARSAL_WAIT_MS_MAX))
    }

    fn claim_rehearsal_within(&self, wait: Duration) -> Option<parking_lot::MutexGuard<'_, bool>> {
        let mut claimed = self.rehearsal.try_lock_for(wait)?;
        if *claimed || !self.texts().is_empty() {
            return None;
        }
        *claimed = true;
        Some(claimed)
    }

    /// What to prepare ahead of an alarm.
    pub fn texts(&self) -> Vec<Arc<str>> {
        self.texts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// One [`AlarmStatements`] per class of an app version: a new deploy starts
/// from nothing, since its handlers may run other statements.
#[derive(Debug, Default)]
pub struct ClassStatements {
    by_class: HashMap<String, Arc<AlarmStatements>>,
}

impl ClassStatements {
    pub fn new(classes: &[String]) -> Self {
        ClassStatements {
            by_class: classes
                .iter()
                .map(|c| (c.clone(), Arc::default()))
                .collect(),
        }
    }

    pub fn for_class(&self, class: &str) -> Option<Arc<AlarmStatements>> {
        self.by_class.get(class).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_each_text_once_and_at_most_the_limit() {
        let s = AlarmStatements::default();
        s.note("SELECT 1");
        s.note("SELECT 1");
        s.note("SELECT 2");
        assert_eq!(
            s.texts().iter().map(|t| &**t).collect::<Vec<_>>(),
            ["SELECT 1", "SELECT 2"]
        );
        for i in 0..100 {
            s.note(&format!("SELECT {i}"));
        }
        let texts = s.texts();
        assert_eq!(texts.len(), ALARM_STATEMENTS_MAX);
        assert_eq!(&*texts[2], "SELECT 0");
    }

    #[test]
    fn one_rehearsal_per_class_and_none_once_something_is_learned() {
        let s = AlarmStatements::default();
        assert!(s.may_need_rehearsal());
        assert!(s.claim_rehearsal().is_some());
        assert!(!s.may_need_rehearsal());
        assert!(s.claim_rehearsal().is_none());
        let learned = AlarmStatements::default();
        learned.note("SELECT 1");
        assert!(!learned.may_need_rehearsal());
        assert!(learned.claim_rehearsal().is_none());
    }

    #[test]
    fn an_actor_waits_for_the_rehearsal_that_runs_and_then_needs_none() {
        let s = Arc::new(AlarmStatements::default());
        let guard = s.claim_rehearsal().unwrap();
        // While it runs, others go on to wait for it.
        assert!(s.may_need_rehearsal());
        let other = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let claimed = s.claim_rehearsal_within(Duration::from_secs(30)).is_some();
                (claimed, s.texts().len())
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        s.note("SELECT 1");
        drop(guard);
        // It waited, and found the class learned.
        assert_eq!(other.join().unwrap(), (false, 1));
    }

    #[test]
    fn classes_learn_apart() {
        let c = ClassStatements::new(&["a".into(), "b".into()]);
        c.for_class("a").unwrap().note("SELECT 1");
        assert_eq!(c.for_class("a").unwrap().texts().len(), 1);
        assert!(c.for_class("b").unwrap().texts().is_empty());
        assert!(c.for_class("c").is_none());
    }
}
