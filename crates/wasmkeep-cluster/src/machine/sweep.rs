//! One pass of a node's sweep over the alarm index (ADR 0009), as a step
//! machine: read each index's overdue part page by page, pick this node's
//! share, hand the picked entries out for delivery a bounded number at a
//! time, and remember across passes which entries to leave alone for a while.
//!
//! The server drives it with object_store and `Runtime::deliver`, the
//! simulator with its simulated bucket and node: both read, pick, defer and
//! decide to sweep again at once by this one machine. What a delivery does to
//! its actor (route, take, run or clean) stays with the driver, which reports
//! it back as [`Reached`] outcomes.
//!
//! A driver's loop:
//!
//! ```text
//! machine.start_pass(now, live_nodes, index_prefixes, held, rotation);
//! loop {
//!     match machine.poll_effect() {
//!         Some(SweepEffect::Bucket(op))  => machine.on_result(perform(op)),
//!         Some(SweepEffect::Deliver(job)) => start the delivery of `job`,
//!         Some(SweepEffect::Done(summary)) => break summary,
//!         None => machine.on_delivered(&job, &report, now) for a delivery that ended,
//!     }
//! }
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::alarm_index::{Address, IndexKey, due_of_key};
use crate::config::ClusterConfig;
use crate::retry::RetryPolicy;
use crate::sweep::{SweepCursor, SweepInput, plan_sweep, sweep_until_ms};

use super::{BucketOp, BucketResult};

/// Deliveries of one pass that run at once.
pub const SWEEP_DELIVERIES_CONCURRENT: usize = 32;
/// Entries remembered as tried recently (a delivery that failed, an entry
/// left for later): past this, the one whose wait ends first is forgotten
/// and may be tried again early.
pub const SWEEP_DEFERRED_MAX: usize = 16_384;
/// After a delivery ran the alarm or found it not due, the entry is left
/// alone this long: the run's upload removes it.
pub const AFTER_RUN_MS: u64 = 10_000;

/// What one delivery of an entry to one actor came to, as the driver saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reached {
    /// The alarm ran (its `on-alarm` committed, whatever it returned).
    Ran,
    /// The actor's committed alarm is not this entry's or not yet due: the
    /// actor's own timer has it.
    NotDue,
    /// A fence was uploaded first; nothing else was concluded.
    Fenced,
    /// Stale entries of the actor were removed (R2, R3).
    Cleaned { removed: u64 },
    /// The actor's database does not name the entry: it may be removed once
    /// every actor it was delivered to says so (the tenant-wide index).
    Removable,
    /// The bucket had nothing for the actor: leave the entry until then.
    Leave { retry_at_ms: u64 },
    /// Another live node owns the actor: the entry is that node's.
    NotOwner,
    /// The bucket, the node's lease or the actor failed: try again later.
    Failed,
    /// No actor here can have this address (no app deployed here has the
    /// class, or the name is not an actor's name).
    Unaddressable,
}

/// The outcomes of one job's deliveries (one per app it reached; an entry of
/// an app's index reaches one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeliveryReport {
    delivered: usize,
    failed: bool,
    not_owner: bool,
    progress: bool,
    unaddressable: bool,
    removable: usize,
    leave_until_ms: Option<u64>,
    removed: u64,
}

impl DeliveryReport {
    /// Adds one delivery's outcome.
    pub fn add(&mut self, reached: Reached) {
        self.delivered += 1;
        match reached {
            Reached::Ran => self.progress = true,
            Reached::Cleaned { removed } => self.add_removed(removed),
            Reached::Removable => self.removable += 1,
            Reached::Leave { retry_at_ms } => {
                self.leave_until_ms = Some(self.leave_until_ms.unwrap_or(0).max(retry_at_ms));
            }
            Reached::Failed => self.failed = true,
            Reached::Unaddressable => self.unaddressable = true,
            Reached::NotOwner => self.not_owner = true,
            Reached::NotDue | Reached::Fenced => {}
        }
    }

    /// Adds entries the driver removed for this job.
    pub fn add_removed(&mut self, removed: u64) {
        self.removed += removed;
        self.progress |= removed > 0;
    }

    /// Whether every delivery said the entry may go (and there was one):
    /// then the driver removes it and its stale siblings.
    pub fn all_removable(&self) -> bool {
        self.delivered > 0 && self.removable == self.delivered
    }

    /// Whether the job got somewhere: an alarm ran or an entry went.
    pub fn progress(&self) -> bool {
        self.progress
    }

    /// Stale entries removed for this job.
    pub fn removed(&self) -> u64 {
        self.removed
    }
}

/// One entry to deliver: the index it was read from (its position in the
/// pass's list of prefixes) and its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepJob {
    /// Position of the entry's index in [`SweepMachine::start_pass`]'s list.
    pub index: usize,
    /// The entry.
    pub key: IndexKey,
    /// The entry's full key in the bucket.
    pub full_key: String,
}

/// What [`SweepMachine::poll_effect`] asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SweepEffect {
    /// List a page and pass the answer to [`SweepMachine::on_result`].
    Bucket(BucketOp),
    /// Deliver this entry and report with [`SweepMachine::on_delivered`].
    Deliver(SweepJob),
    /// The pass is over. Emitted once per pass.
    Done(PassSummary),
}

/// What a pass read and did, for the driver's counters and its next wait.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassSummary {
    /// Whether this node's lease was among the live ones (if not, no share
    /// is its and nothing was read).
    pub swept: bool,
    /// Indexes whose listing the bucket answered.
    pub indexes_read: usize,
    /// Indexes whose next pass resumes after this one's last key (the entry
    /// cap bound).
    pub indexes_resumed: usize,
    /// Overdue entries read.
    pub entries_read: u64,
    /// The due time of the oldest entry read.
    pub oldest_due_ms: Option<u64>,
    /// Entries handed out for delivery.
    pub jobs: usize,
    /// Whether the delivery cap left eligible entries for a later pass.
    pub deliveries_capped: bool,
    /// Whether any delivery got somewhere.
    pub progress: bool,
    /// Sweep again at once: the cap bound and deliveries got somewhere
    /// (entries that fail or reach nobody never make passes run back to
    /// back).
    pub again_now: bool,
}

/// An entry left alone until a time.
#[derive(Clone, Copy, Debug)]
struct Deferred {
    until_ms: u64,
    /// Deliveries of it that failed in a row (each doubles the wait).
    failures: u32,
}

/// The listing of one index in progress.
#[derive(Clone, Debug)]
struct Listing {
    index: usize,
    keys: Vec<String>,
    after: Option<String>,
    limit: usize,
    asked: usize,
}

#[derive(Clone, Debug)]
struct Pass {
    now_ms: u64,
    live: Vec<String>,
    prefixes: Vec<String>,
    held: Vec<BTreeSet<Address>>,
    rotation: u64,
    listing: Option<Listing>,
    awaiting_page: bool,
    next_index: usize,
    budget: usize,
    jobs: VecDeque<SweepJob>,
    outstanding: BTreeSet<(usize, String)>,
    summary: PassSummary,
}

/// A node's sweep: its cursors and deferrals across passes, and the pass in
/// progress.
#[derive(Clone, Debug)]
pub struct SweepMachine {
    me: String,
    config: ClusterConfig,
    cursors: BTreeMap<String, SweepCursor>,
    deferred: HashMap<String, Deferred>,
    pass: Option<Pass>,
}

impl SweepMachine {
    /// The sweep of node `me`, under `config`.
    pub fn new(me: &str, config: ClusterConfig) -> SweepMachine {
        SweepMachine {
            me: me.to_owned(),
            config,
            cursors: BTreeMap::new(),
            deferred: HashMap::new(),
            pass: None,
        }
    }

    /// Starts a pass at `now_ms` over the indexes at `prefixes` (in this
    /// order), with the nodes whose leases are live (`live_nodes`, this node
    /// included if its own lease reads as live). `held[i]` are the actors
    /// of the index at `prefixes[i]` this node holds (their entries are its
    /// own whatever their shard; missing: none). `rotation` is a random
    /// number: where in anyone's entries the pass starts.
    pub fn start_pass(
        &mut self,
        now_ms: u64,
        mut live_nodes: Vec<String>,
        prefixes: Vec<String>,
        mut held: Vec<BTreeSet<Address>>,
        rotation: u64,
    ) {
        held.resize_with(prefixes.len(), BTreeSet::new);
        assert!(self.pass.is_none(), "a pass started while one runs");
        live_nodes.sort();
        live_nodes.dedup();
        let swept = live_nodes.contains(&self.me);
        // Expired deferrals are kept while they count failures: the next
        // failure waits longer.
        self.deferred
            .retain(|_, d| d.until_ms > now_ms || d.failures > 0);
        self.cursors.retain(|p, _| prefixes.contains(p));
        self.pass = Some(Pass {
            now_ms,
            live: live_nodes,
            next_index: if swept { 0 } else { prefixes.len() },
            prefixes,
            held,
            rotation,
            listing: None,
            awaiting_page: false,
            budget: self.config.sweep_deliveries_max,
            jobs: VecDeque::new(),
            outstanding: BTreeSet::new(),
            summary: PassSummary {
                swept,
                ..PassSummary::default()
            },
        });
    }

    /// The next effect, or `None` while the machine waits: for a page, or
    /// for deliveries to end when [`SWEEP_DELIVERIES_CONCURRENT`] run or none
    /// is left to start. `None` also when no pass runs.
    pub fn poll_effect(&mut self) -> Option<SweepEffect> {
        let pass = self.pass.as_mut()?;
        if pass.awaiting_page {
            return None;
        }
        // Listing: one index after the other.
        loop {
            if let Some(l) = &mut pass.listing {
                l.asked = self
                    .config
                    .list_page_keys_max
                    .min(l.limit - l.keys.len())
                    .max(1);
                pass.awaiting_page = true;
                return Some(SweepEffect::Bucket(BucketOp::List {
                    prefix: pass.prefixes[l.index].clone(),
                    start_after: l.after.clone(),
                    limit: l.asked,
                }));
            }
            if pass.next_index >= pass.prefixes.len() {
                break;
            }
            let index = pass.next_index;
            pass.next_index += 1;
            let prefix = &pass.prefixes[index];
            let request = self
                .cursors
                .entry(prefix.clone())
                .or_default()
                .request(&self.config);
            pass.listing = Some(Listing {
                index,
                keys: Vec::new(),
                after: request.start_after.map(|a| format!("{prefix}{a}")),
                limit: request.limit.max(1),
                asked: 0,
            });
        }
        // Delivering, a bounded number at a time.
        if pass.outstanding.len() < SWEEP_DELIVERIES_CONCURRENT
            && let Some(job) = pass.jobs.pop_front()
        {
            let fresh = pass.outstanding.insert((job.index, job.full_key.clone()));
            assert!(fresh, "an entry handed out twice in one pass");
            return Some(SweepEffect::Deliver(job));
        }
        if !pass.outstanding.is_empty() {
            return None;
        }
        let mut pass = self.pass.take().expect("checked above");
        assert!(pass.jobs.is_empty() && pass.listing.is_none());
        assert!(pass.summary.jobs <= self.config.sweep_deliveries_max);
        pass.summary.again_now = pass.summary.deliveries_capped && pass.summary.progress;
        Some(SweepEffect::Done(pass.summary))
    }

    /// The answer to the listing [`SweepMachine::poll_effect`] handed out.
    /// A failed listing skips its index for this pass.
    pub fn on_result(&mut self, result: BucketResult) {
        let pass = self.pass.as_mut().expect("a result with no pass");
        assert!(pass.awaiting_page, "a result with no listing asked for");
        pass.awaiting_page = false;
        let mut l = pass.listing.take().expect("a listing in progress");
        let prefix = pass.prefixes[l.index].clone();
        let BucketResult::Keys(page) = result else {
            return;
        };
        let until = sweep_until_ms(pass.now_ms, &self.config);
        let short = page.len() < l.asked;
        let mut past_due = false;
        let mut moved = false;
        for k in page.iter().take(l.asked) {
            let rel = k.strip_prefix(&prefix).unwrap_or(k).to_owned();
            past_due |= due_of_key(&rel).is_some_and(|d| d > until);
            moved |= l.after.as_ref().is_none_or(|a| k > a);
            l.keys.push(rel);
        }
        l.after = page.last().cloned().or(l.after);
        // A store that answers with keys that do not move forward ends the
        // listing rather than loop.
        if short || past_due || !moved || l.keys.len() >= l.limit {
            self.plan_index(l);
        } else {
            pass.listing = Some(l);
        }
    }

    /// Reads what one index's listing gave and picks this node's share of it
    /// within what is left of the pass's delivery budget.
    fn plan_index(&mut self, l: Listing) {
        let pass = self.pass.as_mut().expect("a pass");
        let prefix = pass.prefixes[l.index].clone();
        let cursor = self.cursors.entry(prefix.clone()).or_default();
        let read = cursor.on_listed(&l.keys, pass.now_ms, &self.config);
        let s = &mut pass.summary;
        s.indexes_read += 1;
        s.indexes_resumed += usize::from(cursor.request(&self.config).start_after.is_some());
        s.entries_read += read.entries.len() as u64;
        if let Some(first) = read.entries.iter().map(|e| e.entry.at_ms).min() {
            s.oldest_due_ms = Some(s.oldest_due_ms.map_or(first, |o| o.min(first)));
        }
        let now = pass.now_ms;
        let waiting: Vec<IndexKey> = read
            .entries
            .into_iter()
            .filter(|k| {
                self.deferred
                    .get(&format!("{prefix}{}", k.to_key()))
                    .is_none_or(|d| d.until_ms <= now)
            })
            .collect();
        // Each index is planned once a pass, so no actor of it is busy with
        // a delivery of this pass yet.
        let busy = BTreeSet::new();
        let cfg = ClusterConfig {
            sweep_deliveries_max: pass.budget,
            ..self.config.clone()
        };
        let input = SweepInput {
            entries: &waiting,
            me: &self.me,
            live_nodes: &pass.live,
            busy: &busy,
            held: &pass.held[l.index],
            rotation: pass.rotation.wrapping_add(l.index as u64),
            now_ms: now,
        };
        let (picked, eligible) = plan_sweep(&input, &cfg);
        assert!(picked.len() <= pass.budget, "a plan over the budget");
        pass.summary.deliveries_capped |= eligible > picked.len();
        pass.budget -= picked.len();
        for key in picked {
            pass.summary.jobs += 1;
            pass.jobs.push_back(SweepJob {
                index: l.index,
                full_key: format!("{prefix}{}", key.to_key()),
                key,
            });
        }
    }

    /// A delivery handed out as [`SweepEffect::Deliver`] ended at `now_ms`
    /// with `report`: the entry is left alone until the report says (a
    /// failure waits a lease period, doubled for each failure in a row, up to
    /// the longest backoff; an actor another live node owns, the same up to
    /// two sweep margins: an entry only its owner can act on is not tried by
    /// every helper every sweep, which at 100 nodes made a node's requests
    /// grow with the cluster).
    pub fn on_delivered(&mut self, job: &SweepJob, report: &DeliveryReport, now_ms: u64) {
        let pass = self.pass.as_mut().expect("a delivery with no pass");
        let full_key = job.full_key.as_str();
        let known = pass.outstanding.remove(&(job.index, job.full_key.clone()));
        assert!(known, "a delivery the machine did not hand out");
        pass.summary.progress |= report.progress;
        let again = report.failed || report.not_owner;
        let failures = match (again, self.deferred.get(full_key)) {
            (true, Some(before)) => before.failures.saturating_add(1),
            (true, None) => 1,
            (false, _) => 0,
        };
        let until_ms = if again {
            // An actor owned elsewhere waits at most two sweep margins: if
            // its owner dies, its entry is this node's again soon.
            let max_ms = if report.failed {
                self.config.retry_max_ms
            } else {
                2 * self.config.sweep_margin_ms()
            };
            let policy = RetryPolicy {
                first_ms: self.config.lease_period_ms,
                max_ms,
                retries_max: None,
            };
            now_ms + policy.delay_ms(failures)
        } else {
            // What ran removes the entry once its upload landed; what reaches
            // no actor here waits the longest backoff, so that neither takes
            // a pass's deliveries again and again.
            let wait = if report.delivered == 0 || report.unaddressable {
                self.config.retry_max_ms
            } else {
                AFTER_RUN_MS
            };
            (now_ms + wait).max(report.leave_until_ms.unwrap_or(0))
        };
        if !self.deferred.contains_key(full_key)
            && self.deferred.len() >= SWEEP_DEFERRED_MAX
            && let Some(first) = self
                .deferred
                .iter()
                .min_by_key(|(_, d)| d.until_ms)
                .map(|(k, _)| k.clone())
        {
            self.deferred.remove(&first);
        }
        self.deferred
            .insert(full_key.to_owned(), Deferred { until_ms, failures });
        assert!(self.deferred.len() <= SWEEP_DEFERRED_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alarm_index::{Address, Entry, app_index_prefix};
    use crate::machine::testing::MapBucket;

    fn key(at: u64, name: &str) -> IndexKey {
        IndexKey::new(Address::new("c", name).unwrap(), Entry::tagged(at, 1, 1)).unwrap()
    }

    /// Runs one pass against `bucket`, answering every delivery with
    /// `reached(job)`; returns the jobs in the order handed out.
    fn pass(
        m: &mut SweepMachine,
        bucket: &mut MapBucket,
        prefixes: &[String],
        now: u64,
        reached: impl Fn(&SweepJob) -> Reached,
    ) -> (Vec<SweepJob>, PassSummary) {
        m.start_pass(now, vec!["me".into()], prefixes.to_vec(), Vec::new(), 7);
        let mut handed = Vec::new();
        let mut running: Vec<SweepJob> = Vec::new();
        loop {
            match m.poll_effect() {
                Some(SweepEffect::Bucket(op)) => {
                    let r = bucket.perform(op);
                    m.on_result(r);
                }
                Some(SweepEffect::Deliver(job)) => {
                    assert!(running.len() < SWEEP_DELIVERIES_CONCURRENT);
                    handed.push(job.clone());
                    running.push(job);
                }
                Some(SweepEffect::Done(s)) => return (handed, s),
                None => {
                    let job = running.pop().expect("the machine waits on a delivery");
                    let mut report = DeliveryReport::default();
                    report.add(reached(&job));
                    m.on_delivered(&job, &report, now);
                }
            }
        }
    }

    fn setup(n: usize, page: usize) -> (MapBucket, Vec<String>, ClusterConfig) {
        let prefix = app_index_prefix("t", "a");
        let mut bucket = MapBucket::default();
        for i in 0..n {
            bucket.put(
                &format!("{prefix}{}", key(1_000, &format!("n{i:04}")).to_key()),
                "",
            );
        }
        let cfg = ClusterConfig {
            list_page_keys_max: page,
            sweep_entries_max: 64,
            sweep_deliveries_max: 40,
            ..ClusterConfig::default()
        };
        (bucket, vec![prefix], cfg)
    }

    #[test]
    fn a_pass_pages_caps_and_defers_what_it_delivered() {
        let (mut bucket, prefixes, cfg) = setup(100, 10);
        let mut m = SweepMachine::new("me", cfg);
        let now = 1_000_000;
        let (jobs, s) = pass(&mut m, &mut bucket, &prefixes, now, |_| Reached::Ran);
        assert_eq!(jobs.len(), 40);
        let lists = bucket
            .log
            .iter()
            .filter(|o| matches!(o, BucketOp::List { .. }))
            .count();
        assert_eq!(lists, 7, "64 keys in pages of 10");
        assert_eq!((s.entries_read, s.indexes_resumed), (64, 1));
        assert!(s.deliveries_capped && s.progress && s.again_now);
        // The next pass resumes after key 64; what ran is left alone.
        let (jobs2, s2) = pass(&mut m, &mut bucket, &prefixes, now + 1, |_| Reached::Ran);
        assert_eq!(s2.entries_read, 36);
        assert_eq!(jobs2.len(), 36);
        assert!(jobs.iter().all(|j| !jobs2.contains(j)));
        // From the start again: the first 40 wait out AFTER_RUN_MS.
        let (jobs3, _) = pass(&mut m, &mut bucket, &prefixes, now + 2, |_| Reached::Ran);
        assert_eq!(jobs3.len(), 24);
        // Past the wait, the entries after key 64 (where the cursor stands) again.
        let (jobs4, _) = pass(
            &mut m,
            &mut bucket,
            &prefixes,
            now + AFTER_RUN_MS + 3,
            |_| Reached::Ran,
        );
        assert_eq!(jobs4, jobs2);
    }

    #[test]
    fn failures_back_off_and_nothing_reached_never_sweeps_again_at_once() {
        let (mut bucket, prefixes, cfg) = setup(100, 50);
        let lease = cfg.lease_period_ms;
        let mut m = SweepMachine::new("me", cfg);
        let now = 1_000_000;
        let (jobs, s) = pass(&mut m, &mut bucket, &prefixes, now, |_| Reached::Failed);
        assert_eq!(jobs.len(), 40);
        assert!(s.deliveries_capped && !s.again_now);
        assert_eq!(m.deferred[&jobs[0].full_key].until_ms, now + lease);
        // Within the wait they are not tried; past it, a second failure waits twice as long.
        let mut t = now + lease;
        let mut seen = 0;
        while seen < 3 {
            let (js, _) = pass(&mut m, &mut bucket, &prefixes, t, |_| Reached::Failed);
            if js.contains(&jobs[0]) {
                seen += 1;
                let d = m.deferred[&jobs[0].full_key];
                assert_eq!(d.until_ms, t + (lease << (d.failures - 1)));
            }
            t += 1_000;
        }
        // An entry nobody here can reach waits the longest backoff.
        let (mut bucket, prefixes, cfg) = setup(1, 50);
        let max = cfg.retry_max_ms;
        let mut m = SweepMachine::new("me", cfg);
        let (jobs, _) = pass(&mut m, &mut bucket, &prefixes, now, |_| {
            Reached::Unaddressable
        });
        assert_eq!(m.deferred[&jobs[0].full_key].until_ms, now + max);
    }

    #[test]
    fn a_node_not_live_reads_nothing_and_a_failed_listing_skips_its_index() {
        let (mut bucket, prefixes, cfg) = setup(10, 50);
        let mut m = SweepMachine::new("me", cfg);
        m.start_pass(
            1_000_000,
            vec!["other".into()],
            prefixes.clone(),
            Vec::new(),
            1,
        );
        match m.poll_effect() {
            Some(SweepEffect::Done(s)) => assert!(!s.swept && s.jobs == 0),
            e => panic!("{e:?}"),
        }
        m.start_pass(1_000_000, vec!["me".into()], prefixes, Vec::new(), 1);
        assert!(matches!(m.poll_effect(), Some(SweepEffect::Bucket(_))));
        assert_eq!(m.poll_effect(), None, "one listing outstanding at a time");
        m.on_result(BucketResult::Failed);
        match m.poll_effect() {
            Some(SweepEffect::Done(s)) => assert_eq!((s.indexes_read, s.jobs), (0, 0)),
            e => panic!("{e:?}"),
        }
        let _ = &mut bucket;
    }

    #[test]
    fn deferrals_are_bounded() {
        let (mut bucket, prefixes, cfg) = setup(1, 50);
        let mut m = SweepMachine::new("me", cfg);
        for i in 0..SWEEP_DEFERRED_MAX {
            m.deferred.insert(
                format!("x{i}"),
                Deferred {
                    until_ms: 2_000_000 + i as u64,
                    failures: 1,
                },
            );
        }
        let (jobs, _) = pass(&mut m, &mut bucket, &prefixes, 1_000_000, |_| {
            Reached::Failed
        });
        assert_eq!(jobs.len(), 1);
        assert_eq!(m.deferred.len(), SWEEP_DEFERRED_MAX);
        assert!(m.deferred.contains_key(&jobs[0].full_key));
        assert!(
            !m.deferred.contains_key("x0"),
            "the earliest wait is forgotten"
        );
    }

    #[test]
    #[should_panic(expected = "a delivery the machine did not hand out")]
    fn a_report_for_a_job_never_handed_out_is_a_driver_bug() {
        let (_, prefixes, cfg) = setup(0, 50);
        let mut m = SweepMachine::new("me", cfg);
        m.start_pass(1, vec!["me".into()], prefixes, Vec::new(), 1);
        let job = SweepJob {
            index: 0,
            key: key(1, "n"),
            full_key: "nope".into(),
        };
        m.on_delivered(&job, &DeliveryReport::default(), 1);
    }

    #[test]
    fn a_report_is_removable_only_when_every_delivery_says_so() {
        let mut r = DeliveryReport::default();
        assert!(!r.all_removable());
        r.add(Reached::Removable);
        assert!(r.all_removable());
        r.add(Reached::NotDue);
        assert!(!r.all_removable());
        r.add_removed(2);
        assert!(r.progress() && r.removed() == 2);
    }
}
