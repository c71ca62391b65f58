//! What the cluster asks of the bucket: requests per node per second by
//! kind, the busiest prefixes against S3's documented rates, and how late
//! sweeps deliver alarms (issue 41's model of cost at scale).
//!
//! Every request a node sends is counted as it is sent (a request that is
//! lost, late or refused still costs one), in the window it was sent in:
//! `faults` (from the start until faults and client requests stop: crashes,
//! cut-offs, stalls, clock faults, lost and late requests, and the client
//! load), `recovery` (the first [`RECOVERY_MS`] after: every node that was
//! down starts again and the alarms the faults held up are delivered) or
//! `steady` (the rest: idle nodes, alarms coming due, no client). A
//! window's per-node rate divides by the node-seconds
//! nodes were up in it, sampled at every invariant check, so that crashed
//! nodes do not dilute it.
//!
//! Prefixes are what S3 rates separately at best: `nodes/`, each app's alarm
//! index, and each actor's folder (`state/<tenant>/<app>/<class>/<name>/`,
//! reported as the busiest one). S3 documents 3,500 PUT/COPY/POST/DELETE and
//! 5,500 GET/HEAD requests per second per partitioned prefix; a LIST is
//! counted with the reads here. A prefix's peaks are its busiest second for
//! writes and its busiest second for reads, each held against its rate.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// How long the `recovery` window lasts after faults stop.
pub const RECOVERY_MS: u64 = 120_000;

/// S3's documented writes (PUT, COPY, POST, DELETE) per second per prefix.
pub const S3_WRITES_PER_PREFIX_S: u64 = 3_500;
/// S3's documented reads (GET, HEAD) per second per prefix.
pub const S3_READS_PER_PREFIX_S: u64 = 5_500;

/// A request's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Put = 0,
    Get = 1,
    List = 2,
    Delete = 3,
}

const KINDS: [(&str, Kind); 4] = [
    ("PUT", Kind::Put),
    ("GET", Kind::Get),
    ("LIST", Kind::List),
    ("DELETE", Kind::Delete),
];

/// Requests by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByKind(pub [u64; 4]);

impl ByKind {
    fn add(&mut self, k: Kind) {
        self.0[k as usize] += 1;
    }
    /// Every request.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// One window of the run.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// Requests sent in the window.
    pub requests: ByKind,
    /// The same by family of prefix: `nodes/` (leases), the alarm indexes,
    /// the actors' folders (chains and holds), anything else.
    pub by_family: BTreeMap<&'static str, ByKind>,
    /// Node-milliseconds up in the window.
    pub node_ms: u64,
    /// The window's length.
    pub ms: u64,
}

impl Window {
    /// Requests of `kind` per node per second.
    pub fn per_node_s(&self, kind: Kind) -> f64 {
        self.rate(self.requests.0[kind as usize])
    }
    /// Requests of `family` and `kind` per node per second.
    pub fn family_per_node_s(&self, family: &str, kind: Kind) -> f64 {
        self.rate(self.by_family.get(family).map_or(0, |b| b.0[kind as usize]))
    }
    /// Every request per node per second.
    pub fn total_per_node_s(&self) -> f64 {
        self.rate(self.requests.total())
    }
    /// Nodes up on average.
    pub fn nodes_up(&self) -> f64 {
        self.node_ms as f64 / self.ms.max(1) as f64
    }
    fn rate(&self, n: u64) -> f64 {
        if self.node_ms == 0 {
            0.0
        } else {
            n as f64 * 1_000.0 / self.node_ms as f64
        }
    }
}

/// A prefix's busiest seconds: for writes, and for reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    /// The most writes (PUT, DELETE) in one second, and which second.
    pub writes: (u64, u64),
    /// The most reads (GET, LIST) in one second, and which second.
    pub reads: (u64, u64),
}

impl Peak {
    fn add(&mut self, kind: Kind, second: u64) {
        let slot = match kind {
            Kind::Put | Kind::Delete => &mut self.writes,
            Kind::Get | Kind::List => &mut self.reads,
        };
        slot.0 += 1;
        slot.1 = second;
    }

    /// Keeps the higher of each.
    fn merge(&mut self, o: Peak) -> bool {
        let mut higher = false;
        if o.writes.0 > self.writes.0 {
            self.writes = o.writes;
            higher = true;
        }
        if o.reads.0 > self.reads.0 {
            self.reads = o.reads;
            higher = true;
        }
        higher
    }
}

/// The prefix family a key's rate is judged in.
fn prefix_of(key: &str) -> Prefix<'_> {
    if key.starts_with("nodes/") {
        return Prefix::Shared("nodes/");
    }
    if let Some(i) = key.find("/_alarms/") {
        return Prefix::Shared(&key[..i + "/_alarms/".len()]);
    }
    if let Some(rest) = key.strip_prefix("alarms/") {
        // The tenant-wide index: `alarms/<tenant>/`.
        let end = rest
            .find('/')
            .map_or(key.len(), |i| "alarms/".len() + i + 1);
        return Prefix::Shared(&key[..end]);
    }
    if key.starts_with("state/") {
        // `state/<tenant>/<app>/<class>/<name>/`: five segments.
        let mut end = 0;
        for _ in 0..5 {
            match key[end..].find('/') {
                Some(i) => end += i + 1,
                None => return Prefix::Shared("other"),
            }
        }
        return Prefix::Actor(&key[..end]);
    }
    Prefix::Shared("other")
}

/// The families of prefixes the per-node rates are broken down by.
pub const FAMILIES: [&str; 4] = ["nodes/", "alarm indexes", "actor folders", "other"];

enum Prefix<'a> {
    /// A prefix every node shares (reported by name).
    Shared(&'a str),
    /// One actor's folder (reported as the busiest).
    Actor(&'a str),
}

/// The run's cost accounting.
#[derive(Clone, Debug, Default)]
pub struct Cost {
    /// Until faults stop.
    pub faults: Window,
    /// The first [`RECOVERY_MS`] after.
    pub recovery: Window,
    /// The rest.
    pub steady: Window,
    /// Whether the quiet window started, and when.
    quiet_now: bool,
    quiet_from_ms: u64,
    /// Busiest second of each shared prefix.
    pub shared_peaks: BTreeMap<String, Peak>,
    /// Busiest second of any one actor's folder, and which.
    pub actor_peak: (Peak, String),
    second: u64,
    this_second: HashMap<String, Peak>,
    /// How late sweeps ran alarms (ms past the entry's time), by the window
    /// the entry was due in.
    pub sweep_lateness: [Vec<u64>; 2],
    /// How late owners' timers ran alarms.
    pub timer_lateness: [Vec<u64>; 2],
}

impl Cost {
    /// Counts one request sent at `now_ms`.
    pub fn count(&mut self, now_ms: u64, kind: Kind, key: &str) {
        let second = now_ms / 1_000;
        if second != self.second {
            self.close_second();
            self.second = second;
        }
        let prefix = prefix_of(key);
        let family = match prefix {
            Prefix::Shared("nodes/") => FAMILIES[0],
            Prefix::Shared("other") => FAMILIES[3],
            Prefix::Shared(_) => FAMILIES[1],
            Prefix::Actor(_) => FAMILIES[2],
        };
        let w = self.window(now_ms);
        w.requests.add(kind);
        w.by_family.entry(family).or_default().add(kind);
        // Actor folders are marked with a leading `@` (no key starts so).
        let name = match prefix {
            Prefix::Shared(p) => p.to_owned(),
            Prefix::Actor(p) => format!("@{p}"),
        };
        self.this_second.entry(name).or_default().add(kind, second);
    }

    /// Ends the second: its counts go to the peaks.
    fn close_second(&mut self) {
        for (name, p) in self.this_second.drain() {
            let (best, actor_name) = match name.strip_prefix('@') {
                Some(actor) => (&mut self.actor_peak.0, Some(actor)),
                None => (self.shared_peaks.entry(name.clone()).or_default(), None),
            };
            if best.merge(p)
                && let Some(a) = actor_name
            {
                self.actor_peak.1 = a.to_owned();
            }
        }
    }

    fn window(&mut self, now_ms: u64) -> &mut Window {
        if !self.quiet_now {
            &mut self.faults
        } else if now_ms < self.quiet_from_ms + RECOVERY_MS {
            &mut self.recovery
        } else {
            &mut self.steady
        }
    }

    /// `nodes_up` nodes were up for the `ms` before `now_ms`.
    pub fn sample(&mut self, now_ms: u64, nodes_up: usize, ms: u64) {
        let w = self.window(now_ms);
        w.node_ms += nodes_up as u64 * ms;
        w.ms += ms;
    }

    /// Faults and client requests stop at `now_ms`: the quiet window starts.
    pub fn quiet_from(&mut self, now_ms: u64) {
        self.quiet_now = true;
        self.quiet_from_ms = now_ms;
    }

    /// An alarm whose entry was due `at_ms` started running at `now_ms`,
    /// from a sweep or from its owner's timer; counted in the window it was
    /// due in.
    pub fn alarm_ran(&mut self, at_ms: u64, now_ms: u64, from_sweep: bool) {
        let late_ms = now_ms.saturating_sub(at_ms);
        let i = usize::from(self.quiet_now && at_ms >= self.quiet_from_ms);
        if from_sweep {
            self.sweep_lateness[i].push(late_ms);
        } else {
            self.timer_lateness[i].push(late_ms);
        }
    }

    /// Ends the run's accounting (the last second counts).
    pub fn finish(&mut self) {
        self.close_second();
    }

    /// The busiest shared prefix's peak, against S3's rates: whether every
    /// prefix stayed within them.
    pub fn within_s3_rates(&self) -> bool {
        self.shared_peaks
            .values()
            .chain(std::iter::once(&self.actor_peak.0))
            .all(|p| p.writes.0 <= S3_WRITES_PER_PREFIX_S && p.reads.0 <= S3_READS_PER_PREFIX_S)
    }
}

/// The `q`-quantile (0..=1) of `values`, or 0 when there are none.
pub fn quantile(values: &[u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

fn window_line(f: &mut fmt::Formatter<'_>, name: &str, w: &Window) -> fmt::Result {
    write!(
        f,
        "bucket requests per node per second ({name}, {:.0} s, {:.1} nodes up on average):",
        w.ms as f64 / 1_000.0,
        w.nodes_up()
    )?;
    for (label, kind) in KINDS {
        write!(f, " {label} {:.3}", w.per_node_s(kind))?;
    }
    writeln!(f, " total {:.3}", w.total_per_node_s())?;
    for family in FAMILIES {
        if !w.by_family.contains_key(family) {
            continue;
        }
        write!(f, "  {family}:")?;
        for (label, kind) in KINDS {
            write!(f, " {label} {:.3}", w.family_per_node_s(family, kind))?;
        }
        writeln!(f)?;
    }
    Ok(())
}

fn peak_text(p: &Peak) -> String {
    format!(
        "{} writes (second {}), {} reads (second {})",
        p.writes.0, p.writes.1, p.reads.0, p.reads.1
    )
}

fn lateness_line(f: &mut fmt::Formatter<'_>, name: &str, v: &[u64]) -> fmt::Result {
    writeln!(
        f,
        "  {name}: {} alarms, p50 {} ms, p99 {} ms, max {} ms",
        v.len(),
        quantile(v, 0.5),
        quantile(v, 0.99),
        v.iter().max().copied().unwrap_or(0)
    )
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        window_line(f, "faults", &self.faults)?;
        window_line(f, "recovery", &self.recovery)?;
        window_line(f, "steady", &self.steady)?;
        writeln!(
            f,
            "busiest second per prefix (S3 documents {S3_WRITES_PER_PREFIX_S} writes and \
             {S3_READS_PER_PREFIX_S} reads per second per prefix):"
        )?;
        for (name, p) in &self.shared_peaks {
            writeln!(f, "  {name}: {}", peak_text(p))?;
        }
        let (p, name) = &self.actor_peak;
        writeln!(
            f,
            "  any one actor's folder (the last busiest: {name}): {}",
            peak_text(p)
        )?;
        writeln!(
            f,
            "alarm lateness, from the entry's time to the run's start, by when it was due:"
        )?;
        lateness_line(f, "sweeps, due in faults", &self.sweep_lateness[0])?;
        lateness_line(f, "sweeps, due in quiet", &self.sweep_lateness[1])?;
        lateness_line(f, "owners' timers, due in faults", &self.timer_lateness[0])?;
        lateness_line(f, "owners' timers, due in quiet", &self.timer_lateness[1])?;
        write!(
            f,
            "every prefix within S3's rates: {}",
            if self.within_s3_rates() { "yes" } else { "NO" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fall_into_the_prefixes_s3_rates() {
        assert!(matches!(
            prefix_of("nodes/n1/0001/0002"),
            Prefix::Shared("nodes/")
        ));
        assert!(matches!(
            prefix_of("state/t1/app1/_alarms/000000000055000/room.t/6130/x"),
            Prefix::Shared("state/t1/app1/_alarms/")
        ));
        assert!(matches!(
            prefix_of("alarms/t1/0001/x"),
            Prefix::Shared("alarms/t1/")
        ));
        assert!(matches!(
            prefix_of("state/t1/app1/room/6130/log/0001"),
            Prefix::Actor("state/t1/app1/room/6130/")
        ));
    }

    #[test]
    fn rates_are_per_node_second_and_peaks_per_second() {
        let mut c = Cost::default();
        c.sample(1_000, 2, 1_000);
        for _ in 0..4 {
            c.count(10, Kind::Put, "nodes/a/1/1");
        }
        c.count(1_500, Kind::Get, "state/t1/app1/room/6130/log/1");
        c.count(1_600, Kind::Get, "state/t1/app1/room/6130/log/2");
        c.sample(2_000, 2, 1_000);
        c.finish();
        assert!((c.faults.per_node_s(Kind::Put) - 1.0).abs() < 1e-9);
        assert_eq!(
            c.shared_peaks["nodes/"],
            Peak {
                writes: (4, 0),
                reads: (0, 0)
            }
        );
        assert_eq!(
            c.actor_peak.0,
            Peak {
                writes: (0, 0),
                reads: (2, 1)
            }
        );
        assert!(c.within_s3_rates());
        // A second of writes over S3's rate is caught even when another
        // second has more requests in all.
        for _ in 0..=S3_WRITES_PER_PREFIX_S {
            c.count(5_000, Kind::Put, "nodes/a/1/2");
        }
        for _ in 0..S3_READS_PER_PREFIX_S {
            c.count(6_000, Kind::List, "nodes/");
        }
        c.finish();
        assert!(!c.within_s3_rates());
        assert_eq!(quantile(&[5, 1, 9, 3], 0.5), 5);
    }
}
