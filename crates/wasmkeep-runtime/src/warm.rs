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

/// How many statements are kept per class. A handler that runs more
/// distinct statements (built with values inside the text, say) gets the
/// first ones warmed and the rest parsed at the due instant, as before.
pub const ALARM_STATEMENTS_MAX: usize = 16;

/// The statements learned for one class, first run first.
#[derive(Debug, Default)]
pub struct AlarmStatements {
    texts: Mutex<Vec<Arc<str>>>,
}

impl AlarmStatements {
    /// Records a statement an alarm handler of this class ran successfully.
    pub fn note(&self, sql: &str) {
        let mut texts = self.texts.lock().unwrap_or_else(|p| p.into_inner());
        if texts.len() < ALARM_STATEMENTS_MAX && !texts.iter().any(|t| &**t == sql) {
            texts.push(Arc::from(sql));
        }
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
    fn classes_learn_apart() {
        let c = ClassStatements::new(&["a".into(), "b".into()]);
        c.for_class("a").unwrap().note("SELECT 1");
        assert_eq!(c.for_class("a").unwrap().texts().len(), 1);
        assert!(c.for_class("b").unwrap().texts().is_empty());
        assert!(c.for_class("c").is_none());
    }
}
